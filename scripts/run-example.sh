#!/usr/bin/env bash
# Newcomer command 1: install what is missing, build, and train on 2 local ranks.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
./build/chorusrun -np 2 ./build/train_mlp
