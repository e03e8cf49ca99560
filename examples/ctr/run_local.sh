#!/usr/bin/env bash
# The CTR training job on a local Tessera cluster: 2 tessera-server processes (RocksDB data
# directories in a temp dir) and 2 tessera-worker processes (--workers N) on 127.0.0.1 train a DLRM click model,
# worker 0 evaluates it on the held-out part and prints the report; its JSON line is the last
# line this script prints. The training curve (metrics.csv), the page with its charts
# (report.html) and the JSON report (report.json) stay in the run directory (--out DIR, default
# runs/<date>-<time> under the repository). Every process the script starts is stopped on exit,
# failure or Ctrl-C.
#
#   bash examples/ctr/run_local.sh                         # generated Criteo-shaped data
#   bash examples/ctr/run_local.sh --data criteo:PATH      # Criteo TSV (every 10th line tests)
#   bash examples/ctr/run_local.sh --data libsvm:PATH      # libSVM / libFM / libFFM
#   bash examples/ctr/run_local.sh --data csv:PATH --schema 'label=click;categorical=site_id,...'
#   bash examples/ctr/run_local.sh --data movielens:DIR    # ratings.csv (+ movies.csv, tags.csv)
#   bash examples/ctr/run_local.sh --checkpoint DIR        # checkpoint the cluster at the end
#   bash examples/ctr/run_local.sh --resume DIR            # restore DIR before training
#   bash examples/ctr/run_local.sh -- --consistency=bsp    # anything after -- goes to the workers
set -euo pipefail

usage() {
  cat <<'EOF'
usage: bash examples/ctr/run_local.sh [options] [-- worker flags...]
  --data SPEC        synthetic (default) | criteo:PATH | libsvm:PATH | csv:PATH | movielens:DIR
  --schema SCHEMA    the columns of --data csv:PATH, e.g.
                     'label=click;numeric=price:log;categorical=site_id,app_id;header=true'
                     (docs/worker.md, "CSV input")
  --skip_bad_lines   csv: skip malformed lines (counted in the report) instead of failing
  --out DIR          the run directory: metrics.csv, report.html, report.json
                     (default: runs/<date>-<time> under the repository)
  --resume DIR       restore the checkpoint in DIR (tessera-ctl restore) before training; the
                     workers carry on from the data positions and clocks stored in it
  --checkpoint DIR   take a checkpoint of the cluster into DIR after training
                     (the servers get DIR's parent as --admin_root: with --resume, both DIRs
                     must be in the same directory)
  --workers N        tessera-worker processes (default 2)
  --keep             keep the temp dir (server data, logs) and print where it is
  -h, --help         this text
Other --flag=value (or --flag value) arguments, and everything after --, are passed to every worker
(see: build/worker/tessera-worker --help), e.g. --train_samples=2000000 --consistency=bsp.
Environment: TESSERA_BUILD_DIR (default: build).
EOF
}

# Paths given by the user are relative to where they ran the script; make them absolute before
# moving to the repository root.
abspath() { realpath -m -- "$1"; }

data=synthetic
schema=""
out=""
resume=""
checkpoint=""
keep=0
workers=2
worker_args=()
while (($# > 0)); do
  case $1 in
    -h | --help) usage; exit 0 ;;
    --data) (($# >= 2)) || { usage >&2; exit 2; }; data=$2; shift 2 ;;
    --data=*) data=${1#--data=}; shift ;;
    --schema) (($# >= 2)) || { usage >&2; exit 2; }; schema=$2; shift 2 ;;
    --schema=*) schema=${1#--schema=}; shift ;;
    --skip_bad_lines) worker_args+=("--skip_bad_lines"); shift ;;
    --out) (($# >= 2)) || { usage >&2; exit 2; }; out=$(abspath "$2"); shift 2 ;;
    --out=*) out=$(abspath "${1#--out=}"); shift ;;
    --out_dir=*) out=$(abspath "${1#--out_dir=}"); shift ;;
    --resume) (($# >= 2)) || { usage >&2; exit 2; }; resume=$(abspath "$2"); shift 2 ;;
    --resume=*) resume=$(abspath "${1#--resume=}"); shift ;;
    --checkpoint) (($# >= 2)) || { usage >&2; exit 2; }; checkpoint=$(abspath "$2"); shift 2 ;;
    --checkpoint=*) checkpoint=$(abspath "${1#--checkpoint=}"); shift ;;
    --keep) keep=1; shift ;;
    --workers) (($# >= 2)) || { usage >&2; exit 2; }; workers=$2; shift 2 ;;
    --workers=*) workers=${1#--workers=}; shift ;;
    --) shift; worker_args+=("$@"); break ;;
    --*=*) worker_args+=("$1"); shift ;;
    # A worker flag in the `--flag value` form; a flag alone (a boolean) when no value follows.
    --*)
      if (($# >= 2)) && [[ $2 != -* ]]; then
        worker_args+=("$1=$2"); shift 2
      else
        worker_args+=("$1"); shift
      fi
      ;;
    *) echo "run_local.sh: unexpected argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done

[[ $workers =~ ^[1-9][0-9]*$ ]] || { echo "run_local.sh: --workers must be a positive number" >&2; exit 2; }
case $data in
  synthetic) ;;
  criteo:* | libsvm:* | csv:* | movielens:*)
    kind=${data%%:*}
    path=${data#*:}
    [[ -n $path ]] || { echo "run_local.sh: --data $kind: needs a path" >&2; exit 2; }
    path=$(abspath "$path")
    [[ -e $path ]] || { echo "run_local.sh: --data $kind: $path does not exist" >&2; exit 2; }
    if [[ $kind == movielens && ! -f $path/ratings.csv ]]; then
      echo "run_local.sh: --data movielens: no ratings.csv in $path" >&2
      exit 2
    fi
    if [[ $kind == csv && -z $schema ]]; then
      echo "run_local.sh: --data csv: needs --schema 'label=COL;categorical=COL,...'" \
        "(docs/worker.md, \"CSV input\")" >&2
      exit 2
    fi
    data=$kind:$path
    ;;
  *) echo "run_local.sh: --data must be synthetic, criteo:PATH, libsvm:PATH, csv:PATH or" \
       "movielens:DIR" >&2
     exit 2 ;;
esac
if [[ -n $schema ]]; then
  [[ $data == csv:* ]] || { echo "run_local.sh: --schema is for --data csv:PATH" >&2; exit 2; }
  worker_args=("--schema=$schema" "${worker_args[@]}")
fi
if [[ -n $resume && ! -d $resume ]]; then
  echo "run_local.sh: --resume: $resume is not a directory" >&2
  exit 2
fi
# The servers take checkpoints and restore them only under their --admin_root, by names
# relative to it: the root is the directory that holds DIR, the name DIR's last component.
admin_root=""
if [[ -n $checkpoint ]]; then admin_root=$(dirname -- "$checkpoint"); fi
if [[ -n $resume ]]; then
  if [[ -n $admin_root && $admin_root != "$(dirname -- "$resume")" ]]; then
    echo "run_local.sh: --checkpoint and --resume must be in the same directory (the servers'" \
      "--admin_root): $checkpoint, $resume" >&2
    exit 2
  fi
  admin_root=$(dirname -- "$resume")
fi

cd "$(dirname "$0")/../.."
# The run directory outlives the run (the temp dir below does not).
if [[ -z $out ]]; then
  out=$PWD/runs/$(date +%Y%m%d-%H%M%S)
  [[ ! -e $out ]] || out=$out-$$
fi
mkdir -p -- "$out" || { echo "run_local.sh: cannot create the run directory $out" >&2; exit 2; }
bash scripts/install_deps.sh
build=${TESSERA_BUILD_DIR:-build}
if [[ ! -f $build/build.ninja ]]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
fi
# Incremental: a no-op when the binaries are up to date.
ninja -C "$build" tessera-server tessera-worker tessera-ctl
for b in tessera-server worker/tessera-worker tessera-ctl; do
  [[ -x $build/$b ]] || { echo "run_local.sh: $build/$b was not built" >&2; exit 1; }
done

work=$(mktemp -d "${TMPDIR:-/tmp}/tessera-ctr.XXXXXX")
[[ -n $admin_root ]] || admin_root=$work/admin
pids=()
cleanup() {
  local rc=$? p
  trap - EXIT INT TERM
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  # Give them 10 s to stop (servers flush RocksDB), then kill what is left.
  for _ in $(seq 100); do
    local alive=0
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    ((alive)) || break
    sleep 0.1
  done
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  if ((keep)); then
    echo "run_local.sh: kept $work" >&2
  else
    rm -rf "$work"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

fail() {
  local f
  echo "run_local.sh: $*" >&2
  for f in "$work"/*.log; do
    [[ -s $f ]] || continue
    echo "--- last lines of $(basename "$f")" >&2
    tail -n 15 "$f" >&2
  done
  exit 1
}

# A port nobody listens on (random, probed with bash's /dev/tcp), different from those in $@.
free_port() {
  local p q used
  for p in $(shuf -i 20000-32000 -n 100); do
    used=0
    for q in "$@"; do [[ $p == "$q" ]] && used=1; done
    ((used)) && continue
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then echo "$p"; return; fi
  done
  return 1
}
p0=$(free_port) || fail "no free port"
p1=$(free_port "$p0") || fail "no free port"
cluster="tcp://127.0.0.1:$p0,tcp://127.0.0.1:$p1"

echo "run_local.sh: servers $cluster, data $data, work dir $work, run dir $out"
for r in 0 1; do
  "$build/tessera-server" --cluster="$cluster" --rank=$r --data_dir="$work/server$r" \
    --admin_root="$admin_root" >"$work/server$r.out" 2>"$work/server$r.log" &
  pids+=($!)
done
for r in 0 1; do
  for _ in $(seq 300); do
    grep -q '^tessera-server ready' "$work/server$r.out" 2>/dev/null && break
    kill -0 "${pids[$r]}" 2>/dev/null || fail "server $r exited before it was ready"
    sleep 0.1
  done
  grep -q '^tessera-server ready' "$work/server$r.out" || fail "server $r not ready after 30 s"
done

ctl() { "$build/tessera-ctl" --cluster="$cluster" --admin_root="$admin_root" "$@"; }
if [[ -n $resume ]]; then
  ctl restore "$(basename -- "$resume")" || fail "restore of $resume failed"
fi

# The workers' progress lines (and a search's lines) are relayed as they come; worker 0's report (its lines after
# training, the JSON line last) is printed once every process is done.
wpids=()
for ((w = 0; w < workers; w++)); do
  # The workers see the servers' --admin_root: worker 0 keeps the best validated state there.
  "$build/worker/tessera-worker" --servers="$cluster" --worker_id=$w --num_workers="$workers" \
    --data="$data" \
    --admin_root="$admin_root" --out_dir="$out" \
    "${worker_args[@]}" >"$work/worker$w.out" 2>"$work/worker$w.log" &
  pids+=($!)
  wpids+=($!)
done
shown=()
rcs=()
for ((w = 0; w < workers; w++)); do shown[w]=0; rcs[w]=-1; done
# Prints the complete lines of worker $1's output not shown yet, except JSON lines.
relay() {
  local w=$1 f="$work/worker$1.out" lines n
  [[ -s $f ]] || return 0
  mapfile -t lines <"$f"
  n=${#lines[@]}
  # A last line without its newline is still being written.
  [[ -z $(tail -c 1 "$f") ]] || n=$((n - 1))
  local i
  for ((i = shown[w]; i < n; i++)); do
    # Worker 0's report (lines not starting with "worker " or "search ") waits for the end.
    [[ $w == 0 && ${lines[i]} != worker\ * && ${lines[i]} != search\ * ]] && continue
    printf '%s\n' "${lines[i]}"
  done
  shown[w]=$n
}
running() { local w; for ((w = 0; w < workers; w++)); do ((rcs[w] < 0)) && return 0; done; return 1; }
while running; do
  sleep 1
  for ((w = 0; w < workers; w++)); do
    relay "$w"
    if ((rcs[w] < 0)) && ! kill -0 "${wpids[$w]}" 2>/dev/null; then
      rc=0
      wait "${wpids[$w]}" || rc=$?
      rcs[w]=$rc
      relay "$w"
      ((rc == 0)) || fail "worker $w failed (exit $rc)"
    fi
  done
  for r in 0 1; do
    kill -0 "${pids[$r]}" 2>/dev/null || fail "server $r exited during training"
  done
done

if [[ -n $checkpoint ]]; then
  ctl checkpoint "$(basename -- "$checkpoint")" || fail "checkpoint into $checkpoint failed"
fi

report=$(grep '^{' "$work/worker0.out" | tail -n 1 || true)
[[ -n $report ]] || fail "worker 0 printed no report"
grep -v -e '^worker ' -e '^search ' -e '^{' "$work/worker0.out" || true
printf '%s\n' "$report" >"$out/report.json"
echo "run_local.sh: training curve $out/metrics.csv"
[[ -f $out/report.html ]] && echo "run_local.sh: report with charts $out/report.html"
echo "run_local.sh: JSON report $out/report.json"
printf '%s\n' "$report"
