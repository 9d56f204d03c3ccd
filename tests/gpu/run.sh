#!/bin/bash
# The GPU suite, on a machine with a GPU (the lent H200: Ubuntu 24.04, Python
# 3.12 with torch 2.11+cu130 and its NCCL, Open MPI, no internet), within 6
# minutes. Needs build/gpu-bundle from tests/gpu/bundle.sh. Prints one PASS or
# FAIL line per check and a summary; the logs go to ${OUT:-build/gpu-suite}.
#   bash tests/gpu/run.sh [--bench]      (--bench: the targets' benchmarks too)
set -uo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
bundle=$repo/build/gpu-bundle
logs=${OUT:-$repo/build/gpu-suite}
mkdir -p "$logs"
py=${PYTHON:-$(command -v python3)}
bench=0
[[ ${1:-} == --bench ]] && bench=1
export LD_LIBRARY_PATH=$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
missing=$(ldd "$bundle/bin/chorusrun" "$bundle/lib/libchorus_cuda.so" | awk '/not found/ {print $1}' | sort -u)
[[ -n $missing ]] && export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$bundle/fallback
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2

# The Python package: sources, libchorus and the CUDA backend beside the
# extension, compiled here for this Python.
pkg=$logs/python
rm -rf "$pkg" && mkdir -p "$pkg" && cp -r python/chorus "$pkg/"
cp -L "$bundle"/lib/libchorus.so* "$bundle/lib/libchorus_cuda.so" "$bundle/bin/chorusrun" "$pkg/chorus/"
ext=$("$py" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
t0=$(date +%s)
includes=$("$py" -c 'import sysconfig
try:
    import pybind11; inc = pybind11.get_include()
except ImportError:
    inc = "/usr/include"
print("-I" + sysconfig.get_paths()["include"], "-I" + inc)')
g++ -O2 -shared -fPIC -std=c++20 $includes -Iinclude -Isrc bindings/module.cc bindings/zero.cc \
  -L"$pkg/chorus" -l:libchorus.so.0 -Wl,-rpath,'$ORIGIN' -o "$pkg/chorus/_core$ext" >"$logs/compile.log" 2>&1 ||
  { cat "$logs/compile.log"; echo "FAIL: the Python extension did not compile"; exit 1; }
echo "compiled chorus._core in $(( $(date +%s) - t0 )) s"
export PYTHONPATH=$pkg
chorusrun=$bundle/bin/chorusrun
pass=0
fail=0
failed=()
check() {  # check NAME TIMEOUT COMMAND... : PASS when the command exits 0
  local name=$1 limit=$2
  shift 2
  local t=$(date +%s) rc=0
  timeout "$limit" "$@" >"$logs/$name.log" 2>&1 || rc=$?
  if ((rc == 0)); then
    echo "PASS $name ($(( $(date +%s) - t )) s)"
    pass=$((pass + 1))
  else
    echo "FAIL $name ($(( $(date +%s) - t )) s, exit $rc$( ((rc == 124)) && echo ', timed out')): tail of $logs/$name.log:"
    tail -15 "$logs/$name.log" | sed 's/^/    /'
    fail=$((fail + 1))
    failed+=("$name")
  fi
}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/GPU: /'

check cuda_backend 120 "$bundle/bin/chorus_gpu_tests"
for n in 1 2 4; do  # ranks sharing the one GPU: staged (1 rank: NCCL)
  check collectives_${n}ranks 150 "$chorusrun" -np $n "$py" tests/gpu/workers/collectives.py
done
check collectives_4ranks_static_sets 150 env CHORUS_TEST_STATIC_SETS=1 "$chorusrun" -np 4 "$py" tests/gpu/workers/collectives.py
check collectives_2ranks_host_asked 120 env CHORUS_GPU_OPERATIONS=host "$chorusrun" -np 2 "$py" tests/gpu/workers/collectives.py
check nccl_one_rank 90 env CHORUS_GPU_OPERATIONS=nccl "$chorusrun" -np 1 "$py" tests/gpu/workers/nccl_checks.py
check nccl_one_rank_collectives 120 env CHORUS_GPU_OPERATIONS=nccl "$chorusrun" -np 1 "$py" tests/gpu/workers/collectives.py
# Two ranks on one GPU: the staged path, said once in the log.
check shared_gpu_logs_staged_once 10 bash -c "[ \$(grep -c 'staged through pinned host memory' '$logs/collectives_2ranks.log') = 1 ]"
check optimizer_cuda_equals_cpu 150 "$chorusrun" -np 2 "$py" tests/gpu/workers/optimizer_equal.py
check peer_death 90 bash -c "CHORUS_TIMEOUT_SECONDS=10 '$chorusrun' --keep-going -np 3 '$py' tests/gpu/workers/peer_death.py | tee /dev/stderr | [ \$(grep -c 'HorovodInternalError caught') = 2 ]"
check digits_cuda 150 bash -c "'$chorusrun' -np 2 '$py' examples/pytorch/digits.py --epochs 5 | tee /dev/stderr | grep -q 'test accuracy 0.9'"
check synthetic_benchmark_cuda 150 "$chorusrun" -np 2 "$py" examples/pytorch/synthetic_benchmark.py --num-iters 2 \
  --json "$logs/synthetic_2.json"
if ((bench)); then
  check bench_staged_2 200 "$chorusrun" -np 2 "$py" tests/gpu/bench_staged.py --json "$logs/staged_2.json"
  check bench_staged_4 240 "$chorusrun" -np 4 "$py" tests/gpu/bench_staged.py --json "$logs/staged_4.json"
  check bench_nccl 120 env CHORUS_GPU_OPERATIONS=nccl "$chorusrun" -np 1 "$py" tests/gpu/bench_nccl.py "$logs/nccl.json"
  check bench_training_4 240 "$chorusrun" -np 4 "$py" examples/pytorch/synthetic_benchmark.py --num-iters 3 \
    --json "$logs/synthetic_4.json"
  for f in "$logs"/bench_*.log; do grep -h "GB/s\|raw ncclAllReduce\|ratio" "$f"; done
  grep -h "ratio" "$logs/synthetic_benchmark_cuda.log"
fi
echo "GPU suite: $pass passed, $fail failed${failed[*]:+ (${failed[*]})}"
((fail == 0))
