#!/usr/bin/env bash
# Checks that the runtime stage of deploy/Dockerfile installs a Debian package for every shared
# library the binaries load directly (their NEEDED entries, `readelf -d`): each is resolved with
# `ldd`, mapped to its package with `dpkg -S`, and that package must be on the runtime stage's
# `apt-get install` line. apt brings the listed packages' own dependencies, so indirect libraries
# need no line. Libraries of Tessera itself (libtessera_*, installed with the binaries) and those
# under a --skip-dir (the CUDA toolkit of a CUDA build: the image is built without CUDA) are not
# checked. Packages on the line that no binary needs are reported, not refused.
# ctest: deploy_runtime_packages (label deploy). Exit 0: covered; 1: a library is not covered or
# cannot be resolved; 2: usage.
# Usage: check_runtime_packages.sh DOCKERFILE [--skip-dir DIR]... BINARY...
set -euo pipefail
fail() { echo "check_runtime_packages: FAIL: $*" >&2; exit 1; }
(($# >= 2)) || { echo "usage: $0 DOCKERFILE [--skip-dir DIR]... BINARY..." >&2; exit 2; }
dockerfile=$1
shift
skip_dirs=()
bins=()
while (($#)); do
  if [[ $1 == --skip-dir ]]; then
    (($# >= 2)) || { echo "--skip-dir needs a directory" >&2; exit 2; }
    [[ -d $2 ]] && skip_dirs+=("$(readlink -f "$2")")
    shift 2
  else
    bins+=("$1")
    shift
  fi
done
((${#bins[@]})) || { echo "no binary given" >&2; exit 2; }
[[ -f $dockerfile ]] || fail "no Dockerfile at $dockerfile"
for tool in readelf ldd dpkg; do
  command -v "$tool" >/dev/null || fail "$tool is needed (Debian: binutils, libc-bin, dpkg)"
done

# ---- the runtime stage's packages: the words after `apt-get install` in the RUN instructions
# after the last FROM, continuation lines joined, options (-y, --no-install-recommends) dropped.
declare -A listed=()
runtime=$(awk '/^FROM /{stage=""} {stage = stage $0 "\n"} END{printf "%s", stage}' "$dockerfile" |
          sed -e ':a' -e '/\\$/N; s/\\\n/ /; ta')
installs=$(grep -oE 'apt-get install[^&;|]*' <<<"$runtime" || true)
[[ -n $installs ]] ||
  fail "$dockerfile: no 'apt-get install' in the runtime stage (after the last FROM)"
for word in $installs; do
  case $word in apt-get|install|-*) ;; *) listed[$word]=1 ;; esac
done
((${#listed[@]})) || fail "$dockerfile: the runtime 'apt-get install' names no package"

# ---- the binaries' direct libraries: "BINARY LIB PATH" lines
entries=()
for bin in "${bins[@]}"; do
  [[ -x $bin ]] || fail "no binary at $bin (build it first)"
  mapfile -t needed < <(readelf -d "$bin" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
  ldd_out=$(ldd "$bin") || fail "ldd $bin failed"
  for lib in "${needed[@]}"; do
    [[ $lib == libtessera_* ]] && continue
    # "libz.so.1 => /lib/x86_64-linux-gnu/libz.so.1 (0x...)", or for the loader
    # "/lib64/ld-linux-x86-64.so.2 (0x...)"
    path=$(awk -v l="$lib" '$1 == l && $2 == "=>" {print $3; exit}
                            $1 ~ ("/" l "$") {print $1; exit}' <<<"$ldd_out")
    [[ -n $path && $path != "not" ]] || fail "$(basename "$bin"): $lib is not found by ldd"
    skip=""
    for d in "${skip_dirs[@]}"; do
      [[ $(readlink -f "$path") == "$d"/* || $path == "$d"/* ]] && skip=1
    done
    [[ -z $skip ]] && entries+=("$(basename "$bin") $lib $path")
  done
done

# ---- library paths to Debian packages, in one dpkg query. dpkg records a file under the path
# its package shipped it at: /lib/... or /usr/lib/... (merged /usr), maybe through a symbolic
# link, so each library is looked up under all of those names.
candidates() {
  local f=$1 real
  real=$(readlink -f "$f")
  printf '%s\n' "$f" "$real" "/usr$f" "/usr$real" "${f#/usr}" "${real#/usr}"
}
mapfile -t all_candidates < <(for e in "${entries[@]}"; do candidates "${e##* }"; done | sort -u)
declare -A owner=()
if ((${#all_candidates[@]})); then
  # "libzmq5:amd64: /usr/lib/x86_64-linux-gnu/libzmq.so.5"; names dpkg does not know are errors.
  while IFS= read -r line; do
    pkg=${line%%: /*}
    owner[${line#*: }]=${pkg%%:*}
  done < <(dpkg -S "${all_candidates[@]}" 2>/dev/null | grep -E '^[^ ]+: /' || true)
fi

declare -A needed_pkgs=()
missing=()
for e in "${entries[@]}"; do
  read -r bin lib path <<<"$e"
  pkg=""
  while IFS= read -r c; do
    if [[ -n ${owner[$c]:-} ]]; then pkg=${owner[$c]}; break; fi
  done < <(candidates "$path")
  [[ -n $pkg ]] ||
    fail "$bin: $lib ($path) belongs to no Debian package: the image cannot install it"
  needed_pkgs[$pkg]=1
  [[ -n ${listed[$pkg]:-} ]] || missing+=("$pkg (for $lib of $bin)")
done
if ((${#missing[@]})); then
  printf 'check_runtime_packages: FAIL: the runtime stage of %s does not install:\n' \
         "$dockerfile" >&2
  printf '  %s\n' "${missing[@]}" | sort -u >&2
  exit 1
fi
for p in "${!listed[@]}"; do
  [[ -n ${needed_pkgs[$p]:-} ]] ||
    echo "check_runtime_packages: note: $p is listed but no binary checked here loads it"
done
echo "check_runtime_packages: OK: ${#needed_pkgs[@]} packages cover the libraries of" \
     "${#bins[@]} binaries"
