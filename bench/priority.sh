#!/usr/bin/env bash
# chorus-priority-bench at each chunk size, whole runs alternated round by round:
# 0 (ops run whole: the small op waits for the large one), the transport's
# default, and two smaller ones. Writes one JSON per run into OUT.
#   bash bench/priority.sh [OUT=bench/results/current/priority] [RANKS=2] [ROUNDS=3]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench/results/current/priority}
ranks=${2:-2}
rounds=${3:-3}
mkdir -p "$out"
for round in $(seq 1 "$rounds"); do
  for chunk in 0 auto 262144 65536; do
    CHORUS_PREEMPT_CHUNK_BYTES=$chunk ./build/chorusrun -x CHORUS_PREEMPT_CHUNK_BYTES -np "$ranks" \
      ./build/chorus-priority-bench --json "$out/chunk_${chunk}_ranks${ranks}_round${round}.json" |
      grep -v '^\[[1-9]'
  done
done
