#!/bin/bash
# Issue 4's 16-rank target on a 16-core machine: allreduce of 32 MiB float32,
# 16 ranks, chorus beside Open MPI in one run, into caller buffers and into
# chorus-allocated outputs; writes the JSON rows and the log under $OUT (or
# ./sixteen-ranks). Uses build/device-bundle (bench/device_bundle.sh) so it runs
# where chorus cannot be built; about 3 minutes.
#   bash bench/sixteen_ranks.sh [ranks]
set -uo pipefail
cd "$(dirname "$0")/.."
bundle=${BUNDLE:-build/device-bundle}
out=${OUT:-sixteen-ranks}
np=${1:-16}
mkdir -p "$out"
exec > >(tee "$out/log.txt") 2>&1
[[ -x $bundle/bin/chorus-bench ]] || { echo "sixteen_ranks.sh: no $bundle: run bench/device_bundle.sh here first" >&2; exit 1; }
export LD_LIBRARY_PATH=$PWD/$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
if ldd "$bundle/bin/chorus-bench" "$bundle/bin/chorusrun" | grep -q "not found"; then
  export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$PWD/$bundle/fallback
fi
echo "commit $(cat "$bundle/COMMIT" 2>/dev/null)  cores $(nproc)  $(date -u +%FT%TZ)"
grep -m1 "model name" /proc/cpuinfo
df -h /dev/shm | tail -1
ldd "$bundle/bin/chorus-bench" | grep -E "not found|chorus|mpi.so|gloo" || true
command -v mpirun && mpirun --version | head -1
run="$bundle/bin/chorusrun --bind-to auto -np $np $bundle/bin/chorus-bench --coll allreduce -b 32M -e 32M -w 3 -n 10 -r 5"
status=0
timeout 240 $run --compare mpi --json "$out/allreduce_${np}ranks.json" || status=$?
timeout 120 $run --outputs chorus --compare mpi --json "$out/allreduce_${np}ranks_own.json" || status=$?
exit $status
