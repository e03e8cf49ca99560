#!/usr/bin/env bash
# Starts a local cluster of 2 tessera-server processes on 127.0.0.1 and runs the client
# workload tessera-demo against it; stops every process it started, also on failure or Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash scripts/install_deps.sh
build=${TESSERA_BUILD_DIR:-build}
if [[ ! -x $build/tessera-server || ! -x $build/tessera-demo ]]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  ninja -C "$build" tessera-server tessera-demo
fi
# A port nobody listens on (a random one in the ephemeral-free range, probed with bash's /dev/tcp).
free_port() {
  local p
  for p in $(shuf -i 20000-32000 -n 50); do
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then echo "$p"; return; fi
  done
  return 1
}
p0=$(free_port); p1=$(free_port)
cluster="tcp://127.0.0.1:$p0,tcp://127.0.0.1:$p1"
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT INT TERM
for r in 0 1; do
  "$build/tessera-server" --cluster="$cluster" --rank=$r 2>"$work/server$r.log" >"$work/server$r.out" &
  pids+=($!)
done
"$build/tessera-demo" --cluster="$cluster" "$@"
