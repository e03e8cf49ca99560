#!/usr/bin/env bash
# Runs bench_transport, bench_sparse and bench_durability (each --quick) from two builds,
# alternating (base, new, base, new, ...), and keeps every run's output and JSON line, so that
# a change that must not change speed (a refactor) is measured against the build before it on
# the same machine at the same time. Each build's benchmarks start that build's tessera-server.
# Usage: bash benchmarks/compare_builds.sh BASE_BUILD_DIR NEW_BUILD_DIR [REPS] [OUT_DIR]
# Prints, per benchmark and figure, the median of each build and new / base.
set -euo pipefail
base=$1 new=$2 reps=${3:-3} out=${4:-$(mktemp -d)}
benches=(bench_transport bench_sparse bench_durability)
for b in "${benches[@]}"; do
  for d in "$base" "$new"; do
    [[ -x $d/benchmarks/$b ]] || { echo "compare_builds: $d/benchmarks/$b missing" >&2; exit 2; }
  done
done
mkdir -p "$out"
for ((r = 1; r <= reps; ++r)); do
  for b in "${benches[@]}"; do
    for side in base new; do
      dir=$base
      [[ $side == new ]] && dir=$new
      "$dir/benchmarks/$b" --quick >"$out/$b.$side.$r.txt" 2>&1 || {
        echo "compare_builds: $b ($side, run $r) failed; see $out/$b.$side.$r.txt" >&2
        exit 1
      }
    done
  done
done
echo "compare_builds: outputs in $out"
python3 - "$out" "$reps" "${benches[@]}" <<'PY'
import json, statistics, sys
out, reps, benches = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def last_json(path):
    line = None
    for l in open(path):
        l = l.strip()
        if l.startswith('{') and l.endswith('}'):
            line = l
    return json.loads(line) if line else {}
def flat(d, prefix=''):
    for k, v in d.items():
        if isinstance(v, dict):
            yield from flat(v, prefix + k + '.')
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            yield prefix + k, float(v)
for b in benches:
    runs = {s: [dict(flat(last_json(f'{out}/{b}.{s}.{r}.txt'))) for r in range(1, reps + 1)]
            for s in ('base', 'new')}
    keys = sorted(set().union(*[set(x) for x in runs['base']]) &
                  set().union(*[set(x) for x in runs['new']]))
    print(f'{b}: figure, base median, new median, new/base ({reps} runs each, alternating)')
    for k in keys:
        bv = [x[k] for x in runs['base'] if k in x]
        nv = [x[k] for x in runs['new'] if k in x]
        mb, mn = statistics.median(bv), statistics.median(nv)
        ratio = f'{mn / mb:.2f}' if mb else 'n/a'
        print(f'  {k}: {mb:.4g} {mn:.4g} {ratio}')
PY
