#!/usr/bin/env bash
# The build stage of deploy/Dockerfile without Docker: in a clean temporary directory, a fresh
# `git clone` of this repository (with --worktree: the files a `docker build` context of this
# checkout holds, i.e. tracked and untracked files that git does not ignore, uncommitted edits
# included), then the same steps as the image's build stage:
#   1. scripts/install_deps.sh (the Debian build packages; installs only what is missing),
#   2. the Dockerfile's RUN instruction after `COPY . /src`, read from the Dockerfile itself
#      (configure, build, `cmake --install build --prefix /opt/tessera`), run in the clean
#      directory with /opt/tessera replaced by a temporary prefix,
# and checks the installed tree: the four binaries answer --version, and the runtime stage's
# package list covers their shared libraries (scripts/check_runtime_packages.sh).
# A full build: 5+ minutes on 2 cores. ctest: container_build_check (label container, not in the
# default suite): TESSERA_TEST_LABELS=container bash scripts/test.sh.
# CMAKE_BUILD_PARALLEL_LEVEL bounds the build's jobs. Keeps the directory with --keep.
# Usage: container_build_check.sh [--worktree] [--keep]
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
mode=clone
keep=""
for arg in "$@"; do
  case $arg in
    --worktree) mode=worktree ;;
    --keep) keep=1 ;;
    *) echo "usage: $0 [--worktree] [--keep]" >&2; exit 2 ;;
  esac
done
dockerfile=$src/deploy/Dockerfile
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tessera-container.XXXXXX")
cleanup() { if [[ -z $keep ]]; then rm -rf "$tmp"; else echo "kept $tmp"; fi; }
trap cleanup EXIT
step() { echo "container_build_check: $*"; }
fail() { echo "container_build_check: FAIL: $*" >&2; exit 1; }

# ---- the clean directory
ctx=$tmp/src
if [[ $mode == clone ]]; then
  step "git clone $src (HEAD $(git -C "$src" rev-parse --short HEAD))"
  git clone --quiet --no-hardlinks "$src" "$ctx" || fail "git clone of $src failed"
  if [[ -n $(git -C "$src" status --porcelain --untracked-files=no) ]]; then
    step "note: uncommitted edits in $src are not in the clone (use --worktree to include them)"
  fi
else
  step "copying the build context of $src (tracked and non-ignored files)"
  mkdir -p "$ctx"
  # Tracked files deleted in the checkout are skipped, as Docker would not see them.
  (cd "$src" && git ls-files -z --cached --others --exclude-standard |
     while IFS= read -r -d '' f; do if [[ -e $f ]]; then printf '%s\0' "$f"; fi; done |
     tar --null -T - -cf -) | tar -xf - -C "$ctx" || fail "copying the tree failed"
fi

# ---- the build stage's steps, read from the Dockerfile
[[ -f $ctx/deploy/Dockerfile ]] ||
  fail "deploy/Dockerfile is not in the clean tree (not committed?)"
# The first stage, continuation lines joined.
build_stage=$(awk '/^FROM /{n++} n==1' "$ctx/deploy/Dockerfile" |
              sed -e ':a' -e '/\\$/N; s/\\\n/ /; ta')
grep -q '^RUN bash /tmp/install_deps.sh' <<<"$build_stage" ||
  fail "the build stage no longer runs install_deps.sh as this script expects: update it"
run=$(awk '/^COPY \. \/src/{found=1; next} found && /^RUN /{sub(/^RUN /, ""); print; exit}' \
      <<<"$build_stage")
[[ -n $run ]] || fail "no RUN after 'COPY . /src' in the Dockerfile's build stage"
grep -q -- '--prefix /opt/tessera' <<<"$run" ||
  fail "the build RUN does not install into /opt/tessera"
prefix=$tmp/opt/tessera
run=${run//\/opt\/tessera/$prefix}

step "1/3 scripts/install_deps.sh"
bash "$ctx/scripts/install_deps.sh" || fail "scripts/install_deps.sh failed"
step "2/3 in the clean tree: $run"
start=$SECONDS
(cd "$ctx" && sh -ec "$run") >"$tmp/build.log" 2>&1 ||
  { tail -40 "$tmp/build.log" >&2; fail "the Dockerfile's build steps failed (log above)"; }
step "   built and installed in $((SECONDS - start)) s"

# ---- the installed tree, as the runtime stage copies it
step "3/3 checking $prefix"
bins=()
for b in tessera-server tessera-worker tessera-ctl tessera-lookup; do
  [[ -x $prefix/bin/$b ]] || fail "not installed: bin/$b"
  out=$("$prefix/bin/$b" --version 2>&1) || fail "bin/$b --version failed: $out"
  [[ $out == "$b "* ]] || fail "bin/$b --version printed '$out'"
  bins+=("$prefix/bin/$b")
done
if readelf -d "$prefix/bin/tessera-worker" | grep -qE 'libcudart|libnccl'; then
  fail "the image's tessera-worker links CUDA: the Dockerfile must configure" \
       "-DTESSERA_ENABLE_CUDA=OFF"
fi
bash "$src/scripts/check_runtime_packages.sh" "$ctx/deploy/Dockerfile" "${bins[@]}" ||
  fail "the runtime stage's packages do not cover the installed binaries"
step "OK: the image's build steps work in a clean directory" \
     "($(du -sh "$prefix" | cut -f1) in the prefix)"
