#!/usr/bin/env bash
# The GPU checks of the worker (issue 11), in one script for a machine with a GPU:
#   1. ctest label gpu: CPU vs CUDA backend on every case, the NCCL group against the CPU group
#      and its aborts, tessera-worker with --backend=cuda (and NCCL with 2 GPUs or more);
#   2. two deliberately broken kernels (mean pooling not divided; embedding gradients negated),
#      each of which must turn GpuCudaBackend.MatchesCpuBackend red;
#   3. bench_gpu (embedding-bag kernels vs memory bandwidth, CUDA vs CPU samples/s, NCCL);
# then prints the figures. Exit status 0 only when the tests pass and both mutants are caught.
#
# Two ways to run it:
#   bash scripts/gpu_check.sh
#       builds here (needs the Debian packages of scripts/install_deps.sh, CUDA and NCCL) in
#       $TESSERA_BUILD_DIR (default build-gpucheck) and runs everything.
#   bash scripts/gpu_check.sh --bundle DIR        (on the build machine, no GPU needed)
#   bash scripts/gpu_check.sh --prebuilt DIR      (on the GPU machine)
#       for a GPU machine that cannot build Tessera (the device tool's image has CUDA but not
#       ZeroMQ, glog, ...): --bundle builds the GPU binaries and the two mutants here, strips
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
kernels=worker/cuda_kernels.cu
# name|sed expression on $kernels: each must make the CPU-vs-CUDA comparison fail.
mutants=("mean_not_divided|s/o\[q\] = acc \* inv;/o[q] = acc;/"
         "emb_grad_negated|s/AddTo(&grad\[size_t(a.rows\[k\]) \* d + q\], WeightOf(a.weights, k) \* g)/AddTo(\&grad[size_t(a.rows[k]) * d + q], -WeightOf(a.weights, k) * g)/")

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
  ninja -C "$build" -j "$(nproc)" "$@" >"$build/gpu_check.build.log" 2>&1 ||
    { tail -40 "$build/gpu_check.build.log"; return 1; }
}

# Builds worker_gpu_test once per mutant (the kernel file is restored afterwards, also on
# interrupt) and copies each binary to DEST/worker_gpu_test.NAME.
build_mutants() {  # build_mutants BUILD_DIR DEST
  local build=$1 dest=$2 backup
  backup=$(mktemp)
  cp "$kernels" "$backup"
  trap 'cp "$backup" "$kernels"' EXIT INT TERM
  for m in "${mutants[@]}"; do
    local name=${m%%|*} expr=${m#*|}
    cp "$backup" "$kernels"
    sed -i "$expr" "$kernels"
    if cmp -s "$backup" "$kernels"; then
      echo "mutant $name: the sed expression no longer matches $kernels" >&2
      cp "$backup" "$kernels"
      return 1
    fi
    ninja -C "$build" worker_gpu_test >"$build/gpu_check.mutant.log" 2>&1 ||
      { tail -20 "$build/gpu_check.mutant.log"; cp "$backup" "$kernels"; return 1; }
    cp "$build/worker/worker_gpu_test" "$dest/worker_gpu_test.$name"
  done
  cp "$backup" "$kernels"
  trap - EXIT INT TERM
  rm -f "$backup"
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
           tests/worker/worker_cli_test benchmarks/bench_gpu; do
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

say "mutants: each broken kernel must fail GpuCudaBackend.MatchesCpuBackend"
for m in "${mutants[@]}"; do
  name=${m%%|*}
  if "$mutant_dir/worker_gpu_test.$name" --gtest_filter='*GpuCudaBackend.MatchesCpuBackend*' \
      >"$logs/mutant_$name.log" 2>&1; then
    echo "mutant $name: NOT caught (the test passed with a broken kernel)"
    status=1
  elif grep -q "SKIPPED" "$logs/mutant_$name.log" && ! grep -q "FAILED" "$logs/mutant_$name.log"; then
    echo "mutant $name: skipped (no GPU?)"
    status=1
  else
    red=$(grep -E '^\[  FAILED  \] .*MatchesCpuBackend/' "$logs/mutant_$name.log" |
      grep -oE 'MatchesCpuBackend/[a-z0-9_]+' | sort -u | wc -l)
    echo "mutant $name: caught: $red of 12 cases red"
  fi
done

say "bench_gpu"
"$tree/benchmarks/bench_gpu" 2>&1 | tee "$logs/bench_gpu.log"
((PIPESTATUS[0] == 0)) || status=1
if nvidia-smi -L >/dev/null 2>&1 && grep -q '"skipped": true' "$logs/bench_gpu.log"; then
  status=1
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
echo "gpu_check: $([[ $status == 0 ]] && echo PASS || echo FAIL)"
exit $status
