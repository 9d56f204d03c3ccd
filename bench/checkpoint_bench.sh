#!/usr/bin/env bash
# Issue 61's checkpoint targets, side by side on this machine: chorus's blocking and
# asynchronous saves against dd; load_checkpoint of a folder the real DeepSpeed 0.19.8
# saved, by DeepSpeed and by chorus, interleaved. Needs build/ and scripts/torch2-venv.sh's venv.
#   bash bench/checkpoint_bench.sh [PARAMS]      (default 85e6: about 1 GB of checkpoint)
set -euo pipefail
cd "$(dirname "$0")/.."
PARAMS=${1:-85e6}
PY=build/venv-torch2/bin/python
DIR=$(mktemp -d /tmp/chorus-ckpt-bench.XXXXXX)
trap 'rm -rf "$DIR"' EXIT
chorus() { PYTHONPATH=build/python OMP_NUM_THREADS=2 build/chorusrun -np 1 --python "$PY" bench/checkpoint_bench.py "$@"; }
deepspeed() {
  env -u PYTHONPATH PYTHONPATH=build/venv-torch2/overlays/deepspeed DS_ACCELERATOR=cpu \
    TORCH_EXTENSIONS_DIR=build/torch_extensions CXX="$PWD/scripts/cxx-nodebug" OMP_NUM_THREADS=2 \
    "$PY" -m torch.distributed.run --standalone --nproc_per_node 1 bench/checkpoint_bench.py "$@"
}
chorus save --params "$PARAMS" --dir "$DIR/saves" | grep RESULT
deepspeed ds-save --params "$PARAMS" --dir "$DIR/ds" | grep saved
for round in 1 2; do
  deepspeed load --params "$PARAMS" --dir "$DIR/ds" --rounds 2 | grep RESULT
  chorus load --params "$PARAMS" --dir "$DIR/ds" --rounds 2 | grep RESULT
done
