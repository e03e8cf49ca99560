#!/usr/bin/env bash
# `pip install` of the Python package as a user does it (ctest python_pip_install, label python):
#  1. a fresh venv (`python3 -m venv --system-site-packages`: Debian's numpy, setuptools, wheel
#     and torch stay visible);
#  2. `pip install --no-build-isolation --no-index SOURCE_DIR` (no package index: pyproject.toml's
#     setuptools backend, whose build_ext runs CMake on the checkout);
#  3. with the venv's interpreter, from outside the tree and without PYTHONPATH:
#     tests/install/pip_check.py imports the installed package (stubs, py.typed, version) and
#     pushes and pulls through real tessera-server processes on 127.0.0.1;
#  4. where torch imports in the venv and the installed package has tessera.torch, the
#     tessera.torch tests (python/tests/test_torch.py: models trained against real servers,
#     checked against pure torch) run on the installed package.
# Exits 77 (ctest: skipped) where the interpreter cannot make a venv with pip.
# Usage: pip_install_test.sh PYTHON SOURCE_DIR WORK_DIR VERSION
#   WORK_DIR keeps pip's CMake build tree between runs (later runs rebuild only what changed);
#   the environment names the server binary: TESSERA_SERVER.
set -euo pipefail
py=$1
src=$(cd "$2" && pwd)
work=$3
version=$4
mkdir -p "$work"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tessera-pip.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
skip() { echo "pip_install_test: SKIP: $*"; exit 77; }
fail() { echo "pip_install_test: FAIL: $*" >&2; exit 1; }
[[ -x ${TESSERA_SERVER:-} ]] || fail "TESSERA_SERVER must name the tessera-server binary"
unset PYTHONPATH PYTHONHOME

# ---- 1. the venv
"$py" -m venv --system-site-packages "$tmp/venv" >"$tmp/venv.log" 2>&1 ||
  { cat "$tmp/venv.log"; skip "$py -m venv failed (Debian: python3-venv)"; }
vpy=$tmp/venv/bin/python
"$vpy" -m pip --version >/dev/null 2>&1 || skip "the venv has no pip (Debian: python3-venv)"
"$vpy" -c "import setuptools, wheel" 2>/dev/null ||
  skip "no setuptools and wheel for --no-build-isolation (Debian: python3-setuptools python3-wheel)"

# ---- 2. pip install (from outside the tree, so that nothing of the checkout is on sys.path)
cd "$tmp"
echo "pip_install_test: pip install --no-build-isolation --no-index $src"
TESSERA_PY_BUILD_DIR=$work CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2} \
  "$vpy" -m pip install --no-build-isolation --no-index --no-cache-dir "$src" \
  >"$tmp/pip.log" 2>&1 || { tail -60 "$tmp/pip.log"; fail "pip install"; }
grep -E "^Successfully installed" "$tmp/pip.log" || true

# ---- 3. the installed package against real servers
"$vpy" -B "$src/tests/install/pip_check.py" "$src" "$version" || fail "the installed package"

# ---- 4. tessera.torch, where the venv has torch and the package has the module
if ! "$vpy" -c "import torch" 2>/dev/null; then
  echo "pip_install_test: tessera.torch not trained: torch does not import in the venv" \
       "(Debian: python3-torch)"
elif ! "$vpy" -c "import importlib.util as u; exit(u.find_spec('tessera.torch') is None)"; then
  echo "pip_install_test: tessera.torch not trained: the installed package has no tessera.torch"
elif [[ ! -f $src/python/tests/test_torch.py ]]; then
  echo "pip_install_test: tessera.torch not trained: no python/tests/test_torch.py in the checkout"
else
  echo "pip_install_test: python/tests/test_torch.py on the installed tessera.torch"
  "$vpy" -B "$src/python/tests/test_torch.py" || fail "tessera.torch on the installed package"
fi
echo "pip_install_test: OK"
