#!/usr/bin/env bash
# bench_gpu_train: the whole training job with a GPU worker against the same job with a CPU
# worker, side by side: tessera-worker --backend=cuda vs --backend=cpu (all cores), each against
# 2 fresh tessera-server processes (memory tier) on 127.0.0.1, same data, model and steps,
# alternating runs; samples/s as the worker reports them (per worker process: one worker,
# one GPU), medians. Two models: tessera-worker's default DLRM (width 8, MLPs 64/64) and a wide
# one (width 64, MLPs 512,256 / 512,256), where the model's compute weighs more than the pushes
# and pulls. The last line is one JSON object ("skipped": true, with the reason, without a GPU).
#
#   bash benchmarks/bench_gpu_train.sh [TREE [REPS]]
#       TREE: the folder holding tessera-server and worker/tessera-worker (default: build);
#       REPS: runs of each configuration (default 3).
set -uo pipefail
tree=${1:-build}
reps=${2:-3}
server=$tree/tessera-server
worker=$tree/worker/tessera-worker
for b in "$server" "$worker"; do
  [[ -x $b ]] || { echo "bench_gpu_train: $b not found (build it, or pass the tree)" >&2; exit 1; }
done
json_skip() {
  echo "bench_gpu_train: skipped: $1"
  echo "{\"bench\": \"gpu_train\", \"skipped\": true, \"reason\": \"$1\"}"
  exit 0
}
command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 || json_skip "no GPU (nvidia-smi)"

work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT INT TERM

free_port() {
  local p
  for p in $(shuf -i 20000-32000 -n 100); do
    [[ $p == "${1:-}" ]] && continue
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then echo "$p"; return; fi
  done
  return 1
}

# run BACKEND MODEL_FLAGS...: starts 2 servers, trains, prints the worker's samples/s.
run() {
  local backend=$1
  shift
  local p0 p1 cluster r
  p0=$(free_port) && p1=$(free_port "$p0") || { echo "no free port" >&2; return 1; }
  cluster="tcp://127.0.0.1:$p0,tcp://127.0.0.1:$p1"
  local spids=()
  for r in 0 1; do
    "$server" --cluster="$cluster" --rank=$r >"$work/server$r.out" 2>"$work/server$r.log" &
    spids+=($!)
    pids+=($!)
  done
  for r in 0 1; do
    for _ in $(seq 300); do
      grep -q '^tessera-server ready' "$work/server$r.out" 2>/dev/null && break
      sleep 0.1
    done
  done
  local out="$work/worker.out"
  "$worker" --servers="$cluster" --job=bench --backend="$backend" --threads="$(nproc)" \
    --batch_size=4096 --train_samples=4000000 --max_steps=120 --evaluate=false \
    --progress_interval_s=1000 "$@" >"$out" 2>"$work/worker.log"
  local rc=$?
  for p in "${spids[@]}"; do kill -9 "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  ((rc == 0)) || { echo "worker ($backend) failed, exit $rc:" >&2; tail -5 "$work/worker.log" >&2; return 1; }
  local sps
  sps=$(sed -nE 's/.*trained [0-9]+ samples in [0-9.]+ s \(([0-9]+) samples\/s\).*/\1/p' "$out" | head -1)
  [[ -n $sps ]] || { echo "worker ($backend): no 'trained ... samples/s' line" >&2; return 1; }
  echo "$sps"
}

median() { sort -n | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }

declare -A models=(
  [default]="--embedding_dim=8 --bottom_mlp=64 --top_mlp=64"
  [wide]="--embedding_dim=64 --bottom_mlp=512,256 --top_mlp=512,256"
)
echo "bench_gpu_train: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), $(nproc) CPU cores, $reps runs each, batch 4096, 120 steps"
json="{\"bench\": \"gpu_train\", \"skipped\": false, \"cpu_threads\": $(nproc)"
for m in default wide; do
  declare -a cpu=() cuda=()
  for ((i = 0; i < reps; i++)); do
    # shellcheck disable=SC2086
    c=$(run cpu ${models[$m]}) || exit 1
    # shellcheck disable=SC2086
    g=$(run cuda ${models[$m]}) || exit 1
    cpu+=("$c")
    cuda+=("$g")
    echo "  $m run $((i + 1)): cpu $c samples/s, cuda $g samples/s"
  done
  mc=$(printf '%s\n' "${cpu[@]}" | median)
  mg=$(printf '%s\n' "${cuda[@]}" | median)
  ratio=$(awk -v a="$mg" -v b="$mc" 'BEGIN {printf "%.2f", a / b}')
  echo "$m model (${models[$m]}): cuda $mg samples/s, cpu $mc samples/s (median): ${ratio}x"
  json+=", \"${m}_cuda_samples_per_s\": $mg, \"${m}_cpu_samples_per_s\": $mc, \"${m}_cuda_vs_cpu\": $ratio"
done
echo "$json}"
