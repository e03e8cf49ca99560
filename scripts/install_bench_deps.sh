#!/usr/bin/env bash
# Installs what the benchmark programs need beyond the build (scripts/install_deps.sh) from
# Debian packages, only those missing: PyTorch for bench_train's PyTorch cell
# (benchmarks/pytorch_dlrm.py) and OpenBLAS, so that torch does not run on the reference BLAS
# (Debian's torch calls libblas.so.3, which the alternatives system points at the
# highest-priority BLAS installed: OpenBLAS once it is there). The test suite needs none of
# this. Works as root or with sudo. Safe to run repeatedly.
set -euo pipefail
bash "$(dirname "$0")/install_deps.sh" python3 python3-numpy python3-torch libopenblas0-pthread
# Say which BLAS libblas.so.3 resolves to (an alternative set by hand may still be the
# reference BLAS).
blas=$(readlink -f /usr/lib/"$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)"/libblas.so.3 2>/dev/null || true)
case "$blas" in
  *openblas*) ;;
  *) echo "install_bench_deps: libblas.so.3 is ${blas:-missing}, not OpenBLAS; select it with:" \
          "update-alternatives --config libblas.so.3-$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)" >&2 ;;
esac
