#!/usr/bin/env bash
# The GPU checks of the worker (issue 11), in one script for a machine with a GPU:
#   1. ctest label gpu: CPU vs CUDA backend on every case, the NCCL group against the CPU group
#      and its aborts, tessera-worker with --backend=cuda (and NCCL with 2 GPUs or more);
#   2. deliberately broken code, each of which must turn its tests red: two kernels (mean
#      pooling not divided; embedding gradients negated: GpuCudaBackend.MatchesCpuBackend), the
#      parameters of a batch staged without them never uploaded (GpuCudaBackendStaging), a
#      staged batch that never expires (GpuCudaBackendStagingEdges), the NCCL union of keys not
#      deduped (GpuNcclReducer.UnionOfManyKeys...);
#   3. bench_gpu (embedding-bag kernels vs memory bandwidth, CUDA vs CPU samples/s, with and
#      without the next batch staged, NCCL);
#   4. bench_feed --quick where the tree has it (the issue-36 cells, cuda_compute_only_samples_per_s
#      and cuda_job_samples_per_s among them) and benchmarks/bench_gpu_train.sh (the whole job,
#      --backend=cuda vs cpu; $TESSERA_GPU_TRAIN_REPS runs of each, default 1; 0 skips it);
# then prints the figures. Exit status 0 only when the tests pass, every mutant is caught and
# the benchmarks run.
#
# Two ways to run it:
#   bash scripts/gpu_check.sh
#       builds here (needs the Debian packages of scripts/install_deps.sh, CUDA and NCCL) in
#       $TESSERA_BUILD_DIR (default build-gpucheck) and runs everything.
#   bash scripts/gpu_check.sh --bundle DIR        (on the build machine, no GPU needed)
#   bash scripts/gpu_check.sh --prebuilt DIR      (on the GPU machine)
#       for a GPU machine that cannot build Tessera (the device tool's image has CUDA but not
#       ZeroMQ, glog, ...): --bundle builds the GPU binaries and the mutants here, strips
#       them and packs them with the non-CUDA libraries they load (a few MiB; CUDA's own
#       libraries come from the GPU machine). --prebuilt runs the same checks from DIR, the
#       test binaries with the filter of label gpu. With the device tool:
#         bash scripts/gpu_check.sh --bundle build-gpu-bundle
#         run(command="bash scripts/gpu_check.sh --prebuilt build-gpu-bundle",
#             carry=["build-gpu-bundle"], timeout_s=480)
# Logs go to $OUT when it is set (the device tool fetches it), else to DIR or the build dir.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
mode=build
dir=""
case "${1:-}" in
  --bundle) mode=bundle; dir=${2:?--bundle DIR} ;;
  --prebuilt) mode=prebuilt; dir=${2:?--prebuilt DIR} ;;
  "") ;;
  *) echo "usage: $0 [--bundle DIR | --prebuilt DIR]" >&2; exit 2 ;;
esac
gpu_targets=(worker_gpu_test worker_cli_test tessera-worker tessera-server bench_gpu)
# Built and run where this tree has it (another part of issue 36 adds it).
optional_targets=(bench_feed)
# name|file|tests|sed expression on file: each must turn the tests (a gtest filter) red.
mutants=("mean_not_divided|worker/cuda_kernels.cu|*GpuCudaBackend.MatchesCpuBackend*|s/o\[q\] = acc \* inv;/o[q] = acc;/"
         "emb_grad_negated|worker/cuda_kernels.cu|*GpuCudaBackend.MatchesCpuBackend*|s/AddTo(&grad\[size_t(a.rows\[k\]) \* d + q\], WeightOf(a.weights, k) \* g)/AddTo(\&grad[size_t(a.rows[k]) * d + q], -WeightOf(a.weights, k) * g)/"
         "staged_params_not_uploaded|worker/cuda_backend.cc|*GpuCudaBackendStaging.*|s|Upload(&s, in, s.key.with_labels, /\*batch=\*/false, true)|Upload(\&s, in, s.key.with_labels, /*batch=*/false, false)|"
         "staged_never_expires|worker/cuda_plan.cc|*GpuCudaBackendStagingEdges*|s/return calls - staged.calls > kStagedLifetimeCalls;/return false;/"
         "union_not_deduped|worker/nccl_local_reducer.cc|*GpuNcclReducer.UnionOfManyKeys*|s/out->assign(h, h + distinct);/out->assign(h, h + total);/")

say() { printf '\n== %s\n' "$*"; }

configure_and_build() {  # configure_and_build BUILD_DIR TARGETS...
  local build=$1
  shift
  local nccl_args=()
  # NCCL from pip (nvidia-nccl-cu13) where the toolkit has none.
  if [[ ! -e /usr/local/cuda/lib64/libnccl.so && ! -e /usr/local/cuda/lib/libnccl.so ]]; then
    local lib
    lib=$(find /usr /opt -name 'libnccl.so*' -path '*nvidia/nccl/lib*' 2>/dev/null | head -1)
    if [[ -n $lib ]]; then
      nccl_args=(-DTESSERA_NCCL_LIBRARY="$lib"
                 -DTESSERA_NCCL_INCLUDE_DIR="$(dirname "$(dirname "$lib")")/include")
    fi
  fi
  mkdir -p "$build"
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "${nccl_args[@]}" \
    >"$build/gpu_check.configure.log" 2>&1 || { cat "$build/gpu_check.configure.log"; return 1; }
  grep "Tessera: CUDA backend" "$build/gpu_check.configure.log"
  grep -q "Tessera: CUDA backend ON" "$build/gpu_check.configure.log" || return 1
  local targets=("$@") t
  for t in "${optional_targets[@]}"; do
    ninja -C "$build" -t targets all 2>/dev/null | grep -q "^$t:" && targets+=("$t")
  done
  ninja -C "$build" -j "$(nproc)" "${targets[@]}" >"$build/gpu_check.build.log" 2>&1 ||
    { tail -40 "$build/gpu_check.build.log"; return 1; }
}

# Builds worker_gpu_test once per mutant (each file is restored afterwards, also on interrupt)
# and copies each binary to DEST/worker_gpu_test.NAME.
build_mutants() {  # build_mutants BUILD_DIR DEST
  local build=$1 dest=$2 backup
  backup=$(mktemp -d)
  local files=(worker/cuda_kernels.cu worker/cuda_backend.cc worker/cuda_plan.cc
               worker/nccl_local_reducer.cc) f
  for f in "${files[@]}"; do cp "$f" "$backup/$(basename "$f")"; done
  restore() { for f in "${files[@]}"; do cp "$backup/$(basename "$f")" "$f"; done; }
  trap restore EXIT INT TERM
  for m in "${mutants[@]}"; do
    local name file expr
    IFS='|' read -r name file _ expr <<<"$m"
    expr=${m#*|*|*|}
    restore
    sed -i "$expr" "$file"
    if cmp -s "$backup/$(basename "$file")" "$file"; then
      echo "mutant $name: the sed expression no longer matches $file" >&2
      restore
      return 1
    fi
    ninja -C "$build" worker_gpu_test >"$build/gpu_check.mutant.log" 2>&1 ||
      { tail -20 "$build/gpu_check.mutant.log"; restore; return 1; }
    cp "$build/worker/worker_gpu_test" "$dest/worker_gpu_test.$name"
  done
  restore
  trap - EXIT INT TERM
  rm -rf "$backup"
  ninja -C "$build" worker_gpu_test >/dev/null  # the real one again
}

if [[ $mode == bundle ]]; then
  build=${TESSERA_BUILD_DIR:-build-gpu}
  say "building ${gpu_targets[*]} in $build"
  configure_and_build "$build" "${gpu_targets[@]}" || exit 1
  rm -rf "$dir"
  mkdir -p "$dir/mutants"
  say "building the mutants"
  build_mutants "$build" "$dir/mutants" || exit 1
  abs_build=$(cd "$build" && pwd)
  echo "$abs_build" >"$dir/build_dir"
  # The binaries at their build-tree paths (the tests name tessera-worker and tessera-server by
  # absolute path; --prebuilt links that path to DIR/tree).
  for f in tessera-server worker/tessera-worker worker/worker_gpu_test \
           tests/worker/worker_cli_test benchmarks/bench_gpu benchmarks/bench_feed; do
    [[ $f == benchmarks/bench_feed && ! -x $build/$f ]] && continue  # optional
    mkdir -p "$dir/tree/$(dirname "$f")"
    strip -o "$dir/tree/$f" "$build/$f"
  done
  strip "$dir"/mutants/*
  # Their shared libraries, except glibc's, the C++ runtime's and CUDA's (from the GPU machine).
  mkdir -p "$dir/lib"
  for f in "$dir"/tree/tessera-server "$dir"/tree/*/*/* "$dir"/tree/*/*; do
    [[ -f $f && -x $f ]] || continue
    ldd "$f" | awk '$3 ~ /^\// {print $3}'
  done | sort -u | grep -vE '/(libc|libm|libpthread|libdl|librt|ld-linux[^/]*|libgcc_s|libstdc\+\+|libcuda|libcudart|libcublas|libcublasLt|libnccl)\.so' |
    while read -r lib; do cp -L "$lib" "$dir/lib/"; done
  du -sh "$dir"
  echo "bundle ready: carry it to the GPU machine and run: bash scripts/gpu_check.sh --prebuilt $dir"
  exit 0
fi

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null ||
  echo "(nvidia-smi not available)"
status=0
if [[ $mode == build ]]; then
  build=${TESSERA_BUILD_DIR:-build-gpucheck}
  logs=${OUT:-$build}
  mkdir -p "$logs"
  say "building ${gpu_targets[*]} in $build"
  configure_and_build "$build" "${gpu_targets[@]}" || {
    echo "cannot build here; build a bundle on the build machine (--bundle) and use --prebuilt"
    exit 1
  }
  say "ctest -L gpu"
  ctest --test-dir "$build" -L gpu --output-on-failure --timeout 600 2>&1 | tee "$logs/ctest_gpu.log"
  ((PIPESTATUS[0] == 0)) || status=1
  mkdir -p "$build/mutants"
  say "building the mutants"
  build_mutants "$build" "$build/mutants" || status=1
  tree=$build
  mutant_dir=$build/mutants
else
  dir=$(cd "$dir" && pwd)
  logs=${OUT:-$dir}
  mkdir -p "$logs"
  orig=$(cat "$dir/build_dir")
  # The tests find tessera-worker and tessera-server at their build-tree paths.
  if [[ ! -e $orig/tessera-server ]]; then
    mkdir -p "$(dirname "$orig")"
    rm -rf "$orig"
    ln -s "$dir/tree" "$orig"
  fi
  libdirs=$(find /usr /opt \( -name 'libcublas.so.1[0-9]' -o -name 'libcublasLt.so.1[0-9]' -o \
    -name 'libcudart.so.1[0-9]' -o -name 'libnccl.so.2' \) -not -path "$dir/*" 2>/dev/null |
    xargs -r -n1 dirname | sort -u | paste -sd:)
  export LD_LIBRARY_PATH="$dir/lib:${libdirs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  missing=$(ldd "$dir/tree/worker/worker_gpu_test" | grep "not found")
  [[ -z $missing ]] || { echo "libraries not found:"; echo "$missing"; exit 1; }
  say "label gpu (worker_gpu_test and worker_cli_test, filter *Gpu*: what ctest -L gpu runs)"
  : >"$logs/ctest_gpu.log"
  for t in worker/worker_gpu_test tests/worker/worker_cli_test; do
    "$dir/tree/$t" --gtest_filter='*Gpu*' 2>&1 | tee -a "$logs/ctest_gpu.log"
    ((PIPESTATUS[0] == 0)) || status=1
  done
  tree=$dir/tree
  mutant_dir=$dir/mutants
fi

say "mutants: each broken kernel or path must turn its tests red"
for m in "${mutants[@]}"; do
  IFS='|' read -r name _ tests _ <<<"$m"
  "$mutant_dir/worker_gpu_test.$name" --gtest_filter="$tests" >"$logs/mutant_$name.log" 2>&1
  rc=$?
  if grep -q "SKIPPED" "$logs/mutant_$name.log" && ! grep -q "FAILED" "$logs/mutant_$name.log"; then
    echo "mutant $name: skipped (no GPU?)"
    status=1
  elif ((rc == 0)); then
    echo "mutant $name: NOT caught (the tests $tests passed with it)"
    status=1
  else
    red=$(grep -oE '^\[  FAILED  \] [A-Za-z][A-Za-z0-9_/.]*' "$logs/mutant_$name.log" |
      sort -u | wc -l)
    all=$(grep -c '^\[ RUN      \]' "$logs/mutant_$name.log")
    echo "mutant $name: caught: $red of $all tests of $tests red"
  fi
done

say "bench_gpu"
"$tree/benchmarks/bench_gpu" 2>&1 | tee "$logs/bench_gpu.log"
((PIPESTATUS[0] == 0)) || status=1
if nvidia-smi -L >/dev/null 2>&1 && grep -q '"skipped": true' "$logs/bench_gpu.log"; then
  status=1
fi

if [[ -x $tree/benchmarks/bench_feed ]]; then
  say "bench_feed --quick"
  "$tree/benchmarks/bench_feed" --quick 2>&1 | tee "$logs/bench_feed.log"
  ((PIPESTATUS[0] == 0)) || status=1
else
  echo "(bench_feed is not in this tree: not run)" | tee "$logs/bench_feed.log"
fi
train_reps=${TESSERA_GPU_TRAIN_REPS:-1}
if ((train_reps > 0)); then
  say "bench_gpu_train ($train_reps run of each)"
  bash "$root/benchmarks/bench_gpu_train.sh" "$tree" "$train_reps" 2>&1 |
    tee "$logs/bench_gpu_train.log"
  ((PIPESTATUS[0] == 0)) || status=1
fi

say "summary"
grep -hE "^\[  (PASSED|FAILED) +\] [0-9]+ tests?|tests passed, .* failed" "$logs/ctest_gpu.log"
skipped=$(grep -E "SKIPPED \]|\(Skipped\)" "$logs/ctest_gpu.log" |
  grep -oE "[A-Za-z/]*Gpu[A-Za-z]*\.[A-Za-z]+[A-Za-z0-9_/]*" | sort -u)
if [[ -n $skipped ]]; then
  echo "skipped (with 1 GPU, AbortFromAnyRankEndsAllWithinASecond and the *WithoutGpu cases"
  echo "are expected here):"
  echo "$skipped" | sed 's/^/  /'
  if nvidia-smi -L >/dev/null 2>&1 &&
      echo "$skipped" | grep -qvE "AbortFromAnyRankEndsAllWithinASecond|WithoutGpu"; then
    echo "a GPU is present, yet tests that need one skipped"
    status=1
  fi
fi
grep -E "^(device|embedding bag|ForwardBackward|NCCL)" "$logs/bench_gpu.log"
tail -1 "$logs/bench_gpu.log"
grep -hoE '"cuda_[a-z_]+": [0-9.e+]+' "$logs/bench_feed.log" 2>/dev/null
[[ -f $logs/bench_gpu_train.log ]] && tail -1 "$logs/bench_gpu_train.log"
echo "gpu_check: $([[ $status == 0 ]] && echo PASS || echo FAIL)"
exit $status
