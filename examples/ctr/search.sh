#!/usr/bin/env bash
# A search over model configs on a local Tessera cluster (docs/worker.md, "Search"): 2
# tessera-server processes and tessera-worker processes (--workers N, default 1) with --search=N
# train N configs (the defaults
# first, then models, widths, MLPs, learning rates and L2 around them) by successive halving,
# each under its own table prefix on the same servers; the best on the validation split is
# trained at the full budget and tested alone. The run directory (--out DIR) gets metrics.csv
# and report.html of the winner, with the trials table, and trials.csv; the JSON report (the
# last line) has search_winner, search_winner_is_default and search_trials. No tessera-ctl.
#
#   bash examples/ctr/search.sh                                   # 8 trials, generated data
#   bash examples/ctr/search.sh --trials 4 --data movielens:DIR --epochs 20
#   bash examples/ctr/search.sh --workers 2                       # each trial on 2 workers
# Every other argument is run_local.sh's (bash examples/ctr/run_local.sh --help).
set -euo pipefail

trials=8
workers=1
args=()
while (($# > 0)); do
  case $1 in
    -h | --help)
      sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'
      exit 0
      ;;
    --trials) (($# >= 2)) || { echo "search.sh: --trials needs a number" >&2; exit 2; }
      trials=$2; shift 2 ;;
    --trials=*) trials=${1#--trials=}; shift ;;
    --workers) (($# >= 2)) || { echo "search.sh: --workers needs a number" >&2; exit 2; }
      workers=$2; shift 2 ;;
    --workers=*) workers=${1#--workers=}; shift ;;
    *) args+=("$1"); shift ;;
  esac
done
[[ $trials =~ ^[1-9][0-9]*$ ]] || { echo "search.sh: --trials must be a positive number" >&2; exit 2; }
[[ $workers =~ ^[1-9][0-9]*$ ]] || { echo "search.sh: --workers must be a positive number" >&2; exit 2; }
# Every worker names the trials' tables with the same search id (new for each search).
search_id=s$(date +%Y%m%d%H%M%S)p$$
exec bash "$(dirname "$0")/run_local.sh" --workers "$workers" --search="$trials" \
  --search_id="$search_id" ${args[@]+"${args[@]}"}
