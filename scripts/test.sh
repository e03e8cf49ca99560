#!/usr/bin/env bash
# Builds Tessera and runs the default test suite (labels unit, integration, durability,
# checkpoint, faults, quality, elastic, gpu, deploy). Tests labelled soak, fuzz, bench or container run
# only when asked for: TESSERA_TEST_LABELS="fuzz" bash scripts/test.sh.
# Installs missing Debian packages first. Usage: bash scripts/test.sh [extra ctest args]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
build=${TESSERA_BUILD_DIR:-build}
jobs=$(nproc)
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
ninja -C "$build" -j "$jobs"
if [[ -n ${TESSERA_TEST_LABELS:-} ]]; then
  ctest --test-dir "$build" --output-on-failure -j 2 --timeout 900 -L "$TESSERA_TEST_LABELS" "$@"
else
  ctest --test-dir "$build" --output-on-failure -j 2 --timeout 600 \
        -LE "soak|fuzz|bench|container" "$@"
fi
