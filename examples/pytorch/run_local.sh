#!/usr/bin/env bash
# A PyTorch example on a local Tessera server: starts one tessera-server (RocksDB data dir in a
# temp dir) on a free 127.0.0.1 port, runs the example against it (train_dlrm.py, or the script
# named first), and prints its report (the last line is JSON). The server is stopped on exit,
# failure or Ctrl-C.
#
#   bash examples/pytorch/run_local.sh                          # 2.5M training samples
#   bash examples/pytorch/run_local.sh --train_samples=1000000  # any train_dlrm.py flag
#   bash examples/pytorch/run_local.sh train_csv.py [--generate]
#
# Environment: TESSERA_BUILD_DIR (default: build), PYTHON (default: the interpreter the build
# configured the module for, from CMakeCache.txt; else python3).
set -euo pipefail

example=train_dlrm.py
if [[ ${1:-} == *.py ]]; then example=$1; shift; fi
cd "$(dirname "$0")/../.."
build=${TESSERA_BUILD_DIR:-build}
if [[ ! -f $build/build.ninja ]]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
fi
# Incremental: a no-op when both are up to date.
ninja -C "$build" tessera-server tessera_python
module=$(ls "$build"/python/tessera/_tessera*.so 2>/dev/null | head -n1 || true)
[[ -n $module ]] || { echo "run_local.sh: no Python module in $build/python (see the" \
  "'Tessera: Python module' line of the CMake configure)" >&2; exit 1; }
python=${PYTHON:-$(sed -n 's/^Python3_EXECUTABLE:[A-Z]*=//p' "$build/CMakeCache.txt")}
python=${python:-python3}

work=$(mktemp -d "${TMPDIR:-/tmp}/tessera-pytorch.XXXXXX")
server=""
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [[ -n $server ]]; then
    kill -TERM "$server" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$server" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$server" 2>/dev/null || true
    wait "$server" 2>/dev/null || true
  fi
  if ((rc != 0)) && [[ -f $work/server.log ]]; then
    echo "--- last lines of the server log" >&2
    tail -n 20 "$work/server.log" >&2
  fi
  rm -rf "$work"
  exit "$rc"
}
trap cleanup EXIT INT TERM

port=$("$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
endpoint=tcp://127.0.0.1:$port
"$build/tessera-server" --cluster="$endpoint" --rank=0 --data_dir="$work/data" \
  >"$work/server.out" 2>"$work/server.log" &
server=$!
for _ in $(seq 300); do
  grep -q "tessera-server ready" "$work/server.out" 2>/dev/null && break
  kill -0 "$server" 2>/dev/null || { echo "run_local.sh: the server exited" >&2; exit 1; }
  sleep 0.1
done
grep -q "tessera-server ready" "$work/server.out" || { echo "run_local.sh: no server" >&2; exit 1; }

PYTHONPATH=$build/python${PYTHONPATH:+:$PYTHONPATH} \
  "$python" "examples/pytorch/$example" --servers="$endpoint" "$@"
