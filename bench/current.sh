#!/usr/bin/env bash
# The current table and plot of every collective (docs/performance.md): chorus
# beside Open MPI (and chorus's own TCP path), 2 ranks bound to cores, float32,
# 8 B to 64 MiB, 3 rounds each (rows show the median). Writes the rows to
# bench/results/current/<op>.json and the plots to docs/img/<op>.png (plots need
# matplotlib: apt-get install python3-matplotlib).
#   bash bench/current.sh [ops...]     (default: every collective)
set -euo pipefail
cd "$(dirname "$0")/.."
ops=("$@")
((${#ops[@]})) || ops=(allreduce allgather broadcast alltoall reducescatter)
mkdir -p bench/results/current docs/img
for op in "${ops[@]}"; do
  ./build/chorusrun --bind-to auto -np 2 ./build/chorus-bench --coll "$op" -b 8 -e 64M -f 8 -w 5 -n 20 -r 3 \
    --compare tcp,mpi --json "bench/results/current/$op.json" | sed -n 's/^\[0\]<stdout>://p'
  /usr/bin/python3 bench/plot_busbw.py "bench/results/current/$op.json" "docs/img/$op.png" || true
done
