#!/usr/bin/env bash
# The Python suite (chorus.torch, chorus.deepspeed) against PyTorch 2.x from PyPI,
# in a venv beside Debian's torch 1.13 (which CI uses). Not part of CI: the wheel
# and its CUDA libraries are about 3 GB (they load without a GPU; everything runs
# on the CPU). Usage: bash scripts/test-torch2.sh [torch version, default 2.5.1]
set -euo pipefail
cd "$(dirname "$0")/.."
version="${1:-2.5.1}"
venv="$(realpath -m "${TORCH2_VENV:-build/venv-torch$version}")"
bash scripts/build.sh
if [ ! -x "$venv/bin/python" ]; then
  /usr/bin/python3 -m venv --system-site-packages "$venv"
  "$venv/bin/pip" install -q "torch==$version"
fi
"$venv/bin/python" -c "import torch; print('torch', torch.__version__)"
cd tests/python
PYTHONPATH= "$venv/bin/python" -m pytest -q -p no:cacheprovider
