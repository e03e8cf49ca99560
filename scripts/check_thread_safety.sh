#!/usr/bin/env bash
# Runs clang's thread-safety analysis (-Wthread-safety, as errors) over the libraries whose
# shared state carries lock annotations (ABSL_GUARDED_BY etc. on tessera::Mutex, ps/mutex.h):
# every .cc of tessera_ps, tessera_client, tessera_server, tessera_storage, tessera_metrics and
# tessera_worker, with the flags, include paths and defines each file has in the build's
# compile_commands.json (g++-only flags dropped). Syntax only: nothing is built or written.
# docs/architecture.md, "Threads and locks".
# Usage: bash scripts/check_thread_safety.sh BUILD_DIR   the check (ctest thread_safety_analysis)
#        bash scripts/check_thread_safety.sh --selftest  proves the check can fail: a guarded
#                                                        field read without its lock must be
#                                                        refused, the same read under the lock
#                                                        accepted (ctest thread_safety_selftest)
# Exit codes: 0 clean, 1 a finding (printed), 2 usage or a missing compile_commands.json,
# 77 clang++ not installed (ctest reports SKIP; scripts/install_deps.sh installs it).
# CLANGXX names the compiler (default: clang++, else clang++-14 ... clang++-19); JOBS the
# number of files checked at once (default 2); ONLY an extended regex that limits the check to
# the files whose path matches (e.g. ONLY=storage/ while converting a room).
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
jobs="${JOBS:-2}"

clang="${CLANGXX:-}"
if [[ -z "$clang" ]]; then
  for c in clang++ clang++-19 clang++-18 clang++-17 clang++-16 clang++-15 clang++-14; do
    if command -v "$c" >/dev/null 2>&1; then clang="$c"; break; fi
  done
fi
if [[ -z "$clang" ]] || ! command -v "$clang" >/dev/null 2>&1; then
  echo "SKIP: clang++ not found; the thread-safety analysis needs clang" \
       "(scripts/install_deps.sh installs the Debian package clang)"
  exit 77
fi
tsa_flags=(-fsyntax-only -Wthread-safety -Werror=thread-safety)

if [[ "${1:-}" == "--selftest" ]]; then
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  cat >"$tmp/body.inc" <<'EOF'
#include "ps/mutex.h"
class Counter {
 public:
  void Bump() {
    tessera::MutexLock l(mu_);
    ++n_;
  }
  void Wait() {
    tessera::MutexLock l(mu_);
    while (n_ == 0) cv_.wait(l.native());
  }
  int Read() READ_BODY
 private:
  tessera::Mutex mu_;
  std::condition_variable cv_;
  int n_ ABSL_GUARDED_BY(mu_) = 0;
};
int main() { return Counter().Read(); }
EOF
  { echo '#define READ_BODY { return n_; }'; cat "$tmp/body.inc"; } >"$tmp/bad.cc"
  { echo '#define READ_BODY { tessera::MutexLock l(mu_); return n_; }'; cat "$tmp/body.inc"; } \
    >"$tmp/good.cc"
  fail=0
  if "$clang" -std=c++20 -I"$root" "${tsa_flags[@]}" "$tmp/bad.cc" >"$tmp/bad.log" 2>&1; then
    echo "FAIL: an unlocked read of a guarded field passed the check"; fail=1
  elif ! grep -q "requires holding mutex 'mu_'" "$tmp/bad.log"; then
    echo "FAIL: the unlocked read failed, but not with the thread-safety finding:"
    cat "$tmp/bad.log"; fail=1
  else
    echo "ok: unlocked read refused: $(grep -m1 'requires holding' "$tmp/bad.log")"
  fi
  if ! "$clang" -std=c++20 -I"$root" "${tsa_flags[@]}" "$tmp/good.cc" >"$tmp/good.log" 2>&1; then
    echo "FAIL: the locked read was refused:"; cat "$tmp/good.log"; fail=1
  else
    echo "ok: locked read accepted"
  fi
  exit "$fail"
fi

build="${1:-}"
if [[ -z "$build" || ! -f "$build/compile_commands.json" ]]; then
  echo "usage: $0 BUILD_DIR (with compile_commands.json: CMAKE_EXPORT_COMPILE_COMMANDS=ON)" >&2
  echo "       $0 --selftest" >&2
  exit 2
fi

# One line per file: the clang++ command, shell-quoted, run from the file's directory.
cmds="$(python3 - "$build/compile_commands.json" "$clang" "${tsa_flags[@]}" <<'EOF'
import json, re, shlex, sys
db, clang, flags = sys.argv[1], sys.argv[2], sys.argv[3:]
targets = ("tessera_ps", "tessera_client", "tessera_server", "tessera_storage",
           "tessera_metrics", "tessera_worker")
gcc_only = re.compile(r"^-fvect-cost-model|^-fno-semantic-interposition$|^-Wno-maybe-uninit")
for e in json.load(open(db)):
    args = e.get("arguments") or shlex.split(e["command"])
    if not e["file"].endswith(".cc"):
        continue
    out = args[args.index("-o") + 1] if "-o" in args else e.get("output", "")
    if not any(f"/{t}.dir/" in "/" + out for t in targets):
        continue
    # Drop the compiler (and a launcher such as ccache in front of it), -o OUT and -c.
    while args and not args[0].startswith("-"):
        args = args[1:]
    keep, skip = [], False
    for a in args:
        if skip:
            skip = False
            continue
        if a == "-o":
            skip = True
            continue
        if a == "-c" or a == e["file"] or gcc_only.match(a):
            continue
        keep.append(a)
    cmd = [clang] + keep + flags + [e["file"]]
    print(f"cd {shlex.quote(e['directory'])} && {shlex.join(cmd)}")
EOF
)" || { echo "could not read $build/compile_commands.json" >&2; exit 2; }
if [[ -n "${ONLY:-}" ]]; then cmds="$(printf '%s\n' "$cmds" | grep -E -- "$ONLY")"; fi
n="$(printf '%s\n' "$cmds" | grep -c .)"
if [[ "$n" -eq 0 ]]; then
  echo "no sources of the checked libraries in $build/compile_commands.json" >&2
  exit 2
fi
echo "thread-safety analysis: $n files with $("$clang" --version | head -1), $jobs at a time"
start=$SECONDS
# Each file's findings print as one block; xargs exits non-zero if any file had one. A file
# this clang++ cannot compile for another reason (a C++20 feature it lacks, such as a lambda
# capturing a structured binding before clang 16) is not analysed: it is listed, not failed.
one_file='
  out="$(eval "$1" 2>&1)" && exit 0
  if grep -q "Wthread-safety" <<<"$out"; then printf "%s\n" "$out"; exit 1; fi
  f="${1##* }"
  echo "not analysed: ${f#'"$root"'/}: $(grep -m1 "error:" <<<"$out" | sed "s|^.*error: ||")"'
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
printf '%s\n' "$cmds" | tr '\n' '\0' | xargs -0 -P "$jobs" -I{} bash -c "$one_file" _ {} |
  tee "$log"
rc=${PIPESTATUS[2]}
skipped="$(grep -c '^not analysed: ' "$log")"
if [[ $rc -ne 0 ]]; then
  echo "FAIL: thread-safety findings above ($((SECONDS - start)) s)"
  exit 1
fi
echo "ok: no thread-safety findings in $((n - skipped)) files, $skipped not analysed" \
     "($((SECONDS - start)) s)"
