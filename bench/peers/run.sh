#!/usr/bin/env bash
# The whole peer benchmark from one command on a fresh machine: prepares Horovod and
# DeepSpeed (cached, bench/peers/prepare.sh), runs the training and ZeRO halves, writes
# their JSON and the tables under OUT (default bench/results/current) and the plot
# (PEERS_PNG, default docs/img/peers.png). Extra arguments go to both halves of run.py,
# e.g.: bash bench/peers/run.sh --rounds 3
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-bench/results/current}"
png="${PEERS_PNG:-docs/img/peers.png}"
mkdir -p "$out" "$(dirname "$png")"
bash bench/peers/prepare.sh
/usr/bin/python3 bench/peers/run.py --only training --json "$out/peers-training.json" "$@"
/usr/bin/python3 bench/peers/run.py --only zero --json "$out/peers-zero.json" "$@"
/usr/bin/python3 bench/peers/report.py "$out/peers-training.json" "$out/peers-zero.json" --png "$png" --markdown \
  | tee "$out/peers-tables.md"
