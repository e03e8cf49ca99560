#!/usr/bin/env bash
# Installs what the benchmark programs need beyond the build (scripts/install_deps.sh) from
# Debian packages, only those missing: PyTorch for bench_train's PyTorch cell
# (benchmarks/pytorch_dlrm.py) and OpenBLAS, so that torch does not run on the reference BLAS
# (Debian's torch calls libblas.so.3, which the alternatives system points at the
# highest-priority BLAS installed: OpenBLAS once it is there). The test suite needs none of
# this. Works as root or with sudo. Safe to run repeatedly.
set -euo pipefail
pkgs=(python3 python3-numpy python3-torch libopenblas0-pthread)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} > 0)); then
  echo "install_bench_deps: installing ${missing[*]}" >&2
  sudo_cmd=()
  if [[ $(id -u) -ne 0 ]]; then sudo_cmd=(sudo); fi
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# Say which BLAS libblas.so.3 resolves to (an alternative set by hand may still be the
# reference BLAS).
blas=$(readlink -f /usr/lib/"$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)"/libblas.so.3 2>/dev/null || true)
case "$blas" in
  *openblas*) ;;
  *) echo "install_bench_deps: libblas.so.3 is ${blas:-missing}, not OpenBLAS; select it with:" \
          "update-alternatives --config libblas.so.3-$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)" >&2 ;;
esac
