#!/bin/bash
# The GPU suite, in one call (the lent H100/H200: Ubuntu 24.04, Python 3.12 with torch
# 2.11+cu130 and its NCCL, Open MPI, no internet), within SUITE_DEADLINE seconds (360).
#   bash tests/gpu/run.sh            the checks (needs build/gpu-bundle: tests/gpu/bundle.sh)
#   bash tests/gpu/run.sh --bench    the targets' benchmarks alone (a second call)
#   bash tests/gpu/run.sh --dry-run  here, without a GPU: the same harness, checks and packing,
#                                    on CPU tensors and the host engine (build/python); the
#                                    checks that need a GPU are SKIPPED, named
# Work and logs go to a folder under /tmp. At exit (also past the deadline or on a signal)
# ${OUT:-build/gpu-suite} gets three files: summary.txt (a line per check and the verdict),
# results.json and logs.tgz; a failure's first traceback is printed. A check passes on what
# the ranks printed and the launcher's report, never on an exit code alone. Verdict: PASSED,
# FAILED, or INCOMPLETE (checks the deadline did not reach: NOT RUN, by name); exit 0 only
# for PASSED.
set -uo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
mode=checks
case ${1:-} in
  --bench) mode=bench ;;
  --dry-run) mode=dry ;;
  "") ;;
  *) echo "usage: bash tests/gpu/run.sh [--bench|--dry-run]" >&2; exit 2 ;;
esac
out=${OUT:-$repo/build/gpu-suite}
bundle=$repo/build/gpu-bundle
mkdir -p "$out"
work=$(mktemp -d /tmp/chorus-gpu-suite.XXXXXX)
logs=$work/logs
mkdir -p "$logs"
hpy=$(command -v python3 || echo /usr/bin/python3)  # (the harness's own helpers, whatever PYTHON is)
completed=0
start=$(date +%s)
deadline=$((start + ${SUITE_DEADLINE:-360}))
: >"$work/results.tsv"  # name, status, seconds, detail

finish() {
  local rc=$?
  trap - EXIT INT TERM
  local verdict
  verdict=$(awk -F'\t' '$2 == "FAIL" {f = 1} $2 == "NOT RUN" {n = 1} END {print f ? "FAILED" : n ? "INCOMPLETE" : "PASSED"}' \
    "$work/results.tsv")
  # (the harness itself stopped before its last check: not a pass, whatever ran)
  [[ $verdict == PASSED && $completed != 1 ]] && verdict="INCOMPLETE (the harness stopped early, exit $rc)"
  [[ $mode == dry ]] && verdict="$verdict (dry run: no GPU; the SKIPPED checks need one)"
  {
    echo "GPU suite ($mode), commit $(cat "$repo/build/gpu-bundle/COMMIT" 2>/dev/null || git -C "$repo" rev-parse --short HEAD 2>/dev/null)"
    awk -F'\t' '{printf "%-8s %-38s %5s s  %s\n", $2, $1, $3, $4}' "$work/results.tsv"
    awk -F'\t' '{c[$2]++} END {printf "%d passed, %d failed, %d skipped, %d not run", c["PASS"], c["FAIL"], c["SKIPPED"], c["NOT RUN"]}' \
      "$work/results.tsv"
    echo " in $(( $(date +%s) - start )) s: $verdict"
  } >"$out/summary.txt"
  "$hpy" - "$work/results.tsv" "$out/results.json" "$verdict" "$mode" <<'PY' || true
import json, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
json.dump({"mode": sys.argv[4], "verdict": sys.argv[3],
           "checks": [{"name": r[0], "status": r[1], "seconds": int(r[2]), "detail": r[3]} for r in rows]},
          open(sys.argv[2], "w"), indent=1)
PY
  tar -czf "$out/logs.tgz" -C "$work" logs 2>/dev/null
  cat "$out/summary.txt"
  rm -rf "$work"
  [[ $verdict == PASSED* ]] && exit 0
  exit $((rc ? rc : 1))
}
trap finish EXIT
trap 'echo "stopped by a signal"; exit 143' INT TERM

record() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "${4//$'\t'/ }" >>"$work/results.tsv"; }
status_of() { awk -F'\t' -v n="$1" '$1 == n {s = $2} END {print s}' "$work/results.tsv"; }

# A log's first traceback (of one rank, its "[r]<stderr>:" tags taken off).
first_traceback() {
  "$hpy" - "$1" <<'PY'
import re, sys
lines = [re.sub(r"^\[\d+\]<std(?:out|err)>:", "", l.rstrip("\n")) for l in open(sys.argv[1], errors="replace")]
for i, l in enumerate(lines):
    if l.startswith("Traceback (most recent call last)"):
        j = i + 1
        while j < len(lines) and (lines[j].startswith(" ") or not lines[j]):
            j += 1
        print("\n".join(lines[i:j + 1][-25:]))
        break
else:
    print("\n".join(lines[-10:]))
PY
}

# check NAME LIMIT [--gpu] [--after OTHER] [--exit CODE] [--expect PATTERN COUNT]... -- COMMAND...
#   --gpu: needs a GPU (SKIPPED in a dry run); --after: reads OTHER's output (SKIPPED unless it
#   passed); --exit: the exit code it must end with (0); --expect: PATTERN in its log exactly COUNT
#   times ("+": at least once). Past the deadline: NOT RUN.
check() {
  local name=$1 limit=$2 gpu=0 after="" want_rc=0
  local -a expects=()
  shift 2
  while [[ $1 != -- ]]; do
    case $1 in
      --gpu) gpu=1; shift ;;
      --after) after=$2; shift 2 ;;
      --exit) want_rc=$2; shift 2 ;;
      --expect) expects+=("$2" "$3"); shift 3 ;;
      *) echo "check $name: unknown option $1" >&2; exit 2 ;;
    esac
  done
  shift
  if ((gpu)) && [[ $mode == dry ]]; then
    echo "SKIPPED $name (needs a GPU)"; record "$name" SKIPPED 0 "needs a GPU"; return
  fi
  if [[ -n $after && $(status_of "$after") != PASS ]]; then
    echo "SKIPPED $name (reads $after's output, which did not pass)"
    record "$name" SKIPPED 0 "reads $after's output, which did not pass"; return
  fi
  local t rc=0 left
  t=$(date +%s)
  left=$((deadline - t))
  if ((left < 10)); then
    echo "NOT RUN $name (the suite's deadline)"; record "$name" "NOT RUN" 0 "the suite's deadline came first"; return
  fi
  ((limit > left)) && limit=$left
  timeout -k 5 "$limit" "$@" >"$logs/$name.log" 2>&1 || rc=$?
  local why=""
  if ((rc == 124 || rc == 137 && want_rc != 137)); then
    why="timed out after $limit s"
  elif ((rc != want_rc)); then
    why="exit $rc, not $want_rc"
  fi
  local k n
  for ((k = 0; k < ${#expects[@]}; k += 2)); do
    [[ -n $why ]] && break
    n=$(grep -c -- "${expects[k]}" "$logs/$name.log")
    if [[ ${expects[k + 1]} == + ]]; then
      ((n > 0)) || why="'${expects[k]}' not in its output"
    elif ((n != expects[k + 1])); then
      why="'${expects[k]}' $n times in its output, not ${expects[k + 1]}"
    fi
  done
  local secs=$(( $(date +%s) - t ))
  if [[ -z $why ]]; then
    echo "PASS $name ($secs s)"; record "$name" PASS "$secs" ""
  else
    echo "FAIL $name ($secs s): $why; its first traceback ($name.log in logs.tgz):"
    first_traceback "$logs/$name.log" | sed 's/^/    /'
    record "$name" FAIL "$secs" "$why"
  fi
}

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2
if [[ $mode == dry ]]; then
  # This machine's build: its Python package, chorusrun and Debian's torch, CPU tensors.
  py=${PYTHON:-/usr/bin/python3}
  chorusrun=$repo/build/chorusrun
  export PYTHONPATH=$repo/build/python CHORUS_TEST_DEVICE=cpu DS_ACCELERATOR=cpu
  dev=cpu
  {
    echo "dry run: no GPU; $("$py" -c 'import torch; print("torch", torch.__version__)')"
  } >"$logs/environment.log" 2>&1
  [[ -x $chorusrun && -d $repo/build/python/chorus ]] || { echo "dry run: build first (scripts/build.sh)"; record environment FAIL 0 "no build"; exit 1; }
  record environment PASS 0 "dry run"
else
  py=${PYTHON:-$(command -v python3)}
  dev=cuda
  # The environment first: when it is wrong nothing else means anything.
  {
    echo "commit: $(cat "$bundle/COMMIT" 2>/dev/null || echo unknown)"
    nvidia-smi --query-gpu=name,driver_version,memory.total,compute_mode --format=csv,noheader || echo "nvidia-smi failed"
    "$py" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count())' || echo "torch failed"
  } 2>&1 | tee "$logs/environment.log"
  stop() { echo "FAIL environment: $*"; record environment FAIL 0 "$*"; exit 1; }
  [[ -d $bundle ]] || stop "no $bundle (run tests/gpu/bundle.sh here first, carry build/gpu-bundle)"
  gpumode=$(nvidia-smi --query-gpu=compute_mode --format=csv,noheader 2>/dev/null | head -1)
  [[ -n $gpumode ]] || stop "nvidia-smi shows no GPU"
  # 2- and 4-rank checks run several processes on the one GPU.
  [[ $gpumode == Default ]] || stop "the GPU's compute mode is '$gpumode'; the suite needs Default (several processes per GPU)"
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
  # The Python package under /tmp: sources, libchorus and the CUDA backend beside the
  # extension, compiled here for this Python (its translation units in parallel).
  pkg=$work/python
  mkdir -p "$pkg/obj" && cp -r python/chorus "$pkg/"
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
  record environment PASS $(( $(date +%s) - start )) ""
fi

# "loss A -> B (... on DEVICE)" with B < A / 2: an example trained there ("halved" said).
fell() {
  "$py" -c 'import re, sys
m = re.search(r"loss ([\d.]+) -> ([\d.]+) \(.* on " + sys.argv[2] + r"\)", open(sys.argv[1]).read())
print(f"loss {m[1]} -> {m[2]}: halved" if m and float(m[2]) < float(m[1]) / 2 else f"not halved: {m and m[0]}")' "$1" "$2"
}
export -f fell
export py

if [[ $mode == bench ]]; then
  check bench_staged_2 200 --gpu -- "$chorusrun" -np 2 "$py" tests/gpu/bench_staged.py --json "$logs/staged_2.json"
  check bench_staged_4 240 --gpu -- "$chorusrun" -np 4 "$py" tests/gpu/bench_staged.py --json "$logs/staged_4.json"
  check bench_adam 120 --gpu -- "$py" tests/gpu/bench_adam.py --json "$logs/adam.json"
  check bench_nccl 120 --gpu -- env CHORUS_GPU_OPERATIONS=nccl "$chorusrun" -np 1 "$py" tests/gpu/bench_nccl.py "$logs/nccl.json"
  check bench_training_4 240 --gpu -- "$chorusrun" -np 4 "$py" examples/pytorch/synthetic_benchmark.py --num-iters 3 \
    --json "$logs/synthetic_4.json"
  for f in "$logs"/bench_*.log; do [[ -f $f ]] && grep -h "GB/s\|raw ncclAllReduce\|ratio" "$f"; done
  completed=1
  exit 0
fi

# What decides the most, first: one collective, the seed's DeepSpeed program, the ZeRO
# engine on the device against the host engine. Limits: twice the expected time.
check collectives_1rank 60 --expect "collectives on $dev OK on 1 ranks" 1 -- \
  "$chorusrun" -np 1 "$py" tests/gpu/workers/collectives.py
check seed_deepspeed_1rank 60 --expect 'Epoch \[5/5\]' + -- "$chorusrun" -np 1 "$py" examples/deepspeed/seed_simple.py
check zero_device_1rank 120 --expect "zero device ok 0" 1 -- "$chorusrun" -np 1 "$py" tests/gpu/workers/zero_device.py
check cuda_backend 60 --gpu --expect "PASSED" + -- "$bundle/bin/chorus_gpu_tests"
for n in 2 4; do  # ranks sharing the one GPU: staged (NCCL needs a GPU each)
  check collectives_${n}ranks 60 --expect "collectives on $dev OK on $n ranks" 1 -- \
    "$chorusrun" -np $n "$py" tests/gpu/workers/collectives.py
done
check seed_deepspeed_2ranks 60 --expect 'Epoch \[5/5\]' + -- "$chorusrun" -np 2 "$py" examples/deepspeed/seed_simple.py
check zero_device_2ranks 120 --expect "zero device ok [01]" 2 -- \
  "$chorusrun" -np 2 "$py" tests/gpu/workers/zero_device.py --quick --ckpt "$work/ckpt"
check zero_checkpoint_gpu_to_cpu 60 --after zero_device_2ranks --expect "zero device load ok" 1 -- \
  env DS_ACCELERATOR=cpu "$chorusrun" -np 1 "$py" tests/gpu/workers/zero_device_load.py "$work/ckpt"
check optimizer_device_equals_cpu 60 --expect "optimizer on $dev equals cpu" + -- \
  "$chorusrun" -np 2 "$py" tests/gpu/workers/optimizer_equal.py
# A rank killed mid-allreduce: the launcher reports it and both others catch the error.
check peer_death 60 --exit 137 --expect "HorovodInternalError caught" 2 \
  --expect "rank 1 was killed by signal 9" 1 -- \
  env CHORUS_TIMEOUT_SECONDS=10 "$chorusrun" --keep-going -np 3 "$py" tests/gpu/workers/peer_death.py
check collectives_4ranks_static_sets 60 --expect "collectives on $dev OK on 4 ranks" 1 -- \
  env CHORUS_TEST_STATIC_SETS=1 "$chorusrun" -np 4 "$py" tests/gpu/workers/collectives.py
check collectives_2ranks_host_asked 60 --gpu --expect "collectives on cuda OK on 2 ranks" 1 -- \
  env CHORUS_GPU_OPERATIONS=host "$chorusrun" -np 2 "$py" tests/gpu/workers/collectives.py
check nccl_one_rank 60 --gpu --expect "nccl checks OK" 1 -- \
  env CHORUS_GPU_OPERATIONS=nccl "$chorusrun" -np 1 "$py" tests/gpu/workers/nccl_checks.py
check nccl_one_rank_collectives 60 --gpu --expect "collectives on cuda OK on 1 ranks" 1 -- \
  env CHORUS_GPU_OPERATIONS=nccl "$chorusrun" -np 1 "$py" tests/gpu/workers/collectives.py
# Two ranks on one GPU: the staged path, said once in the log.
check shared_gpu_logs_staged_once 5 --gpu --after collectives_2ranks \
  --expect 'staged through pinned host memory' 1 -- cat "$logs/collectives_2ranks.log"
check digits 90 --expect 'test accuracy 0.9' + -- "$chorusrun" -np 2 "$py" examples/pytorch/digits.py --epochs 5
check synthetic_benchmark 90 --expect "img/sec per rank" + -- "$chorusrun" -np 2 "$py" examples/pytorch/synthetic_benchmark.py \
  --num-iters 2 --json "$work/synthetic_2.json"
# Experts and long sequences (2 ranks sharing the GPU: the all-to-alls staged): each example
# trains, its loss at least halving in 40 steps.
check moe_2ranks 90 --expect "loss .* -> .* on $dev" 1 -- \
  "$chorusrun" -np 2 "$py" examples/deepspeed/moe_transformer.py --steps 40
check moe_2ranks_trained 5 --after moe_2ranks --expect ": halved" 1 -- bash -c 'fell "$@"' fell "$logs/moe_2ranks.log" "$dev"
check ulysses_2ranks 90 --expect "loss .* -> .* on $dev" 1 -- \
  "$chorusrun" -np 2 "$py" examples/deepspeed/ulysses_transformer.py --steps 40
check ulysses_2ranks_trained 5 --after ulysses_2ranks --expect ": halved" 1 -- bash -c 'fell "$@"' fell "$logs/ulysses_2ranks.log" "$dev"
completed=1
