#!/usr/bin/env bash
# Builds (once) the real DeepSpeed's CPU ops that the reference tests load, into the
# build folder's torch_extensions, two at a time. Otherwise the first tests to need
# them each build one while the others wait on torch's build lock with a core idle.
# Usage: bash scripts/deepspeed-ops.sh PYTHON   (the torch 2 venv's: scripts/torch2-venv.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
py="$1"
overlay="$(dirname "$(dirname "$py")")/overlays/deepspeed"
# (CXX: as tests/frameworks/conftest.py builds them: scripts/cxx-nodebug)
export TORCH_EXTENSIONS_DIR="$PWD/build/torch_extensions" DS_ACCELERATOR=cpu CXX="$PWD/scripts/cxx-nodebug"
ops=(CPUAdamBuilder CPULionBuilder CPUAdagradBuilder FusedAdamBuilder ShareMemCommBuilder PinMemoryBuilder)
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
if ! printf '%s\n' "${ops[@]}" | xargs -P 2 -I OP env -u PYTHONPATH PYTHONPATH="$overlay" "$py" -c "
from deepspeed.ops.op_builder.cpu import OP
OP().load(verbose=False)" > "$log" 2>&1; then
  cat "$log" >&2
  echo "building DeepSpeed's CPU ops failed (above)" >&2
  exit 1
fi
