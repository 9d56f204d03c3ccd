#!/bin/bash
# The GPU suite, on a machine with a GPU (the lent H100/H200: Ubuntu 24.04,
# Python 3.12 with torch 2.11+cu130 and its NCCL, Open MPI, no internet), in one
# call within SUITE_DEADLINE seconds (default 420). Needs build/gpu-bundle from
# tests/gpu/bundle.sh. The first check prints the environment and stops the
# suite when it is wrong; then one PASS, FAIL or NOT RUN line per check (NOT RUN:
# the deadline came first) and a summary, always; every log goes to
# ${OUT:-build/gpu-suite}.
#   bash tests/gpu/run.sh [--bench]      (--bench: the targets' benchmarks, a second call)
set -uo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
bundle=$repo/build/gpu-bundle
logs=${OUT:-$repo/build/gpu-suite}
mkdir -p "$logs"
py=${PYTHON:-$(command -v python3)}
bench=0
[[ ${1:-} == --bench ]] && bench=1
start=$(date +%s)
deadline=$((start + ${SUITE_DEADLINE:-420}))
pass=0
fail=0
notrun=0
failed=()
summary() {
  echo "GPU suite: $pass passed, $fail failed, $notrun not run${failed[*]:+ (${failed[*]})} in $(( $(date +%s) - start )) s; logs in $logs"
}
trap summary EXIT
stop() {  # the environment is wrong: nothing else can mean anything
  echo "FAIL environment: $*"
  fail=$((fail + 1))
  failed+=(environment)
  exit 1
}

# The environment, first.
{
  echo "commit: $(cat "$bundle/COMMIT" 2>/dev/null || echo unknown)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,compute_mode --format=csv,noheader || echo "nvidia-smi failed"
  "$py" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count())' || echo "torch failed"
} 2>&1 | tee "$logs/environment.log"
[[ -d $bundle ]] || stop "no $bundle (run tests/gpu/bundle.sh here first, carry build/gpu-bundle)"
mode=$(nvidia-smi --query-gpu=compute_mode --format=csv,noheader 2>/dev/null | head -1)
[[ -n $mode ]] || stop "nvidia-smi shows no GPU"
# 2- and 4-rank checks run several processes on the one GPU.
[[ $mode == Default ]] || stop "the GPU's compute mode is '$mode'; the suite needs Default (several processes per GPU)"
# NCCL lives only in torch's nvidia/nccl/lib here; the C++ checks never import chorus's Python package.
nccl=$("$py" -c 'import glob, os, sys
hits = [h for p in sys.path for h in glob.glob(os.path.join(p, "nvidia", "nccl", "lib", "libnccl.so.2"))]
print(hits[0] if hits else "")')
[[ -n $nccl ]] || stop "no libnccl.so.2 under torch's nvidia/nccl/lib on sys.path"
export CHORUS_NCCL_LIBRARY=$nccl
echo "NCCL: $nccl" | tee -a "$logs/environment.log"
export LD_LIBRARY_PATH=$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
missing=$(ldd "$bundle/bin/chorusrun" "$bundle/lib/libchorus_cuda.so" | awk '/not found/ {print $1}' | sort -u)
[[ -n $missing ]] && export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$bundle/fallback
ldd "$bundle"/lib/libchorus.so* "$bundle/lib/libchorus_cuda.so" >>"$logs/environment.log" 2>&1
still=$(ldd "$bundle/bin/chorusrun" "$bundle/lib/libchorus_cuda.so" | awk '/not found/ {print $1}' | sort -u)
[[ -z $still ]] || stop "libraries not found even with the bundle's fallback: $still"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2

# The Python package: sources, libchorus and the CUDA backend beside the
# extension, compiled here for this Python (its translation units in parallel).
pkg=$logs/python
rm -rf "$pkg" && mkdir -p "$pkg/obj" && cp -r python/chorus "$pkg/"
cp -L "$bundle"/lib/libchorus.so* "$bundle/lib/libchorus_cuda.so" "$bundle/bin/chorusrun" "$pkg/chorus/"
ext=$("$py" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
t0=$(date +%s)
includes=$("$py" -c 'import sysconfig
try:
    import pybind11; inc = pybind11.get_include()
except ImportError:
    inc = "/usr/include"
print("-I" + sysconfig.get_paths()["include"], "-I" + inc)')
pids=()
for tu in bindings/*.cc; do
  g++ -O2 -c -fPIC -std=c++20 $includes -Iinclude -Isrc "$tu" -o "$pkg/obj/$(basename "$tu" .cc).o" \
    >"$logs/compile_$(basename "$tu" .cc).log" 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || { cat "$logs"/compile_*.log; stop "the Python extension did not compile"; }; done
g++ -shared "$pkg"/obj/*.o -L"$pkg/chorus" -l:libchorus.so.0 -Wl,-rpath,'$ORIGIN' -o "$pkg/chorus/_core$ext" \
  >"$logs/link.log" 2>&1 || { cat "$logs/link.log"; stop "the Python extension did not link"; }
echo "compiled chorus._core in $(( $(date +%s) - t0 )) s"
export PYTHONPATH=$pkg
chorusrun=$bundle/bin/chorusrun
check() {  # check NAME LIMIT COMMAND... : PASS when it exits 0; NOT RUN past the deadline
  local name=$1 limit=$2
  shift 2
  local t=$(date +%s) rc=0
  local left=$((deadline - t))
  if ((left < 15)); then
    echo "NOT RUN $name (the suite's deadline)"
    notrun=$((notrun + 1))
    return
  fi
  ((limit > left)) && limit=$left
  timeout -k 5 "$limit" "$@" >"$logs/$name.log" 2>&1 || rc=$?
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
# count_in LOG PATTERN N: the log holds PATTERN exactly N times (N "+": at least once).
count_in() {
  local n
  n=$(grep -c -- "$2" "$1")
  if [[ $3 == + ]]; then ((n > 0)); else [[ $n == "$3" ]]; fi
}
export -f count_in

check cuda_backend 120 "$bundle/bin/chorus_gpu_tests"
for n in 1 2 4; do  # ranks sharing the one GPU: staged (1 rank: NCCL)
  check collectives_${n}ranks 150 "$chorusrun" -np $n "$py" tests/gpu/workers/collectives.py
done
# The ZeRO engine on the GPU: the seed's DeepSpeed program as the seed wrote it
# (import changed), the engine against itself in host memory and one torch
# process, a checkpoint from the GPU loaded in host memory.
check seed_deepspeed_1rank 120 "$chorusrun" -np 1 "$py" examples/deepspeed/seed_simple.py
check seed_deepspeed_1rank_trained 5 bash -c 'count_in "$@"' count_in "$logs/seed_deepspeed_1rank.log" 'Epoch \[5/5\]' +
check seed_deepspeed_2ranks 150 "$chorusrun" -np 2 "$py" examples/deepspeed/seed_simple.py
check zero_device_1rank 180 "$chorusrun" -np 1 "$py" tests/gpu/workers/zero_device.py
check zero_device_2ranks 180 "$chorusrun" -np 2 "$py" tests/gpu/workers/zero_device.py --quick --ckpt "$logs/ckpt"
check zero_checkpoint_gpu_to_cpu 90 env DS_ACCELERATOR=cpu "$chorusrun" -np 1 "$py" tests/gpu/workers/zero_device_load.py \
  "$logs/ckpt"
check collectives_4ranks_static_sets 150 env CHORUS_TEST_STATIC_SETS=1 "$chorusrun" -np 4 "$py" tests/gpu/workers/collectives.py
check collectives_2ranks_host_asked 120 env CHORUS_GPU_OPERATIONS=host "$chorusrun" -np 2 "$py" tests/gpu/workers/collectives.py
check nccl_one_rank 90 env CHORUS_GPU_OPERATIONS=nccl "$chorusrun" -np 1 "$py" tests/gpu/workers/nccl_checks.py
check nccl_one_rank_collectives 120 env CHORUS_GPU_OPERATIONS=nccl "$chorusrun" -np 1 "$py" tests/gpu/workers/collectives.py
# Two ranks on one GPU: the staged path, said once in the log.
check shared_gpu_logs_staged_once 5 bash -c 'count_in "$@"' count_in "$logs/collectives_2ranks.log" 'staged through pinned host memory' 1
check optimizer_cuda_equals_cpu 150 "$chorusrun" -np 2 "$py" tests/gpu/workers/optimizer_equal.py
check peer_death 90 env CHORUS_TIMEOUT_SECONDS=10 "$chorusrun" --keep-going -np 3 "$py" tests/gpu/workers/peer_death.py
check peer_death_caught_twice 5 bash -c 'count_in "$@"' count_in "$logs/peer_death.log" 'HorovodInternalError caught' 2
check digits_cuda 150 "$chorusrun" -np 2 "$py" examples/pytorch/digits.py --epochs 5
check digits_cuda_accuracy 5 bash -c 'count_in "$@"' count_in "$logs/digits_cuda.log" 'test accuracy 0.9' +
check synthetic_benchmark_cuda 150 "$chorusrun" -np 2 "$py" examples/pytorch/synthetic_benchmark.py --num-iters 2 \
  --json "$logs/synthetic_2.json"
# Experts and long sequences on the GPU (2 ranks sharing it: the all-to-alls staged):
# each example trains there, its loss at least halving in 40 steps.
fell() {  # fell LOG: the example's "loss A -> B (... on cuda)" line with B < A / 2
  "$py" -c 'import re, sys
m = re.search(r"loss ([\d.]+) -> ([\d.]+) \(.* on cuda\)", open(sys.argv[1]).read())
sys.exit(0 if m and float(m[2]) < float(m[1]) / 2 else 1)' "$1"
}
export -f fell
export py
check moe_cuda_2ranks 120 "$chorusrun" -np 2 "$py" examples/deepspeed/moe_transformer.py --steps 40
check moe_cuda_2ranks_trained 5 bash -c 'fell "$@"' fell "$logs/moe_cuda_2ranks.log"
check ulysses_cuda_2ranks 120 "$chorusrun" -np 2 "$py" examples/deepspeed/ulysses_transformer.py --steps 40
check ulysses_cuda_2ranks_trained 5 bash -c 'fell "$@"' fell "$logs/ulysses_cuda_2ranks.log"
if ((bench)); then
  check bench_staged_2 200 "$chorusrun" -np 2 "$py" tests/gpu/bench_staged.py --json "$logs/staged_2.json"
  check bench_staged_4 240 "$chorusrun" -np 4 "$py" tests/gpu/bench_staged.py --json "$logs/staged_4.json"
  check bench_adam 120 "$py" tests/gpu/bench_adam.py --json "$logs/adam.json"
  check bench_nccl 120 env CHORUS_GPU_OPERATIONS=nccl "$chorusrun" -np 1 "$py" tests/gpu/bench_nccl.py "$logs/nccl.json"
  check bench_training_4 240 "$chorusrun" -np 4 "$py" examples/pytorch/synthetic_benchmark.py --num-iters 3 \
    --json "$logs/synthetic_4.json"
  for f in "$logs"/bench_*.log; do grep -h "GB/s\|raw ncclAllReduce\|ratio" "$f"; done
  grep -h "ratio" "$logs/synthetic_benchmark_cuda.log"
fi
((fail == 0))
