#!/usr/bin/env bash
# Prepares the real peers that bench/peers/run.py measures chorus against, cached:
#   $PEERS_DIR/venv-horovod  Debian's python + torch 1.13 (--system-site-packages) and
#                            Horovod 0.28.1 built from PyPI's sdist (gloo + Open MPI; ~8 min)
#   $TORCH2_VENV             the torch 2 venv of scripts/test-torch2.sh, plus DeepSpeed
#                            from PyPI (run with DS_ACCELERATOR=cpu over gloo)
# Usage: bash bench/peers/prepare.sh   (PEERS_DIR default build/peers,
#        TORCH2_VENV default build/venv-torch2.5.1). Builds chorus first.
set -euo pipefail
cd "$(dirname "$0")/../.."
peers="$(realpath -m "${PEERS_DIR:-build/peers}")"
torch2="$(realpath -m "${TORCH2_VENV:-build/venv-torch2.5.1}")"
horovod_version=0.28.1
deepspeed_version=0.19.8
torch2_version=2.5.1
mkdir -p "$peers"

bash scripts/install-deps.sh >/dev/null
bash scripts/build.sh >/dev/null

hvd="$peers/venv-horovod"
if ! "$hvd/bin/python" -c "import horovod.torch" 2>/dev/null; then
  echo "building Horovod $horovod_version into $hvd (about 8 minutes on 2 cores)"
  rm -rf "$hvd"
  /usr/bin/python3 -m venv --system-site-packages "$hvd"
  # Horovod's setup.py needs these at build time; no isolation so that it sees Debian's torch.
  "$hvd/bin/pip" install -q "setuptools<70" wheel cloudpickle psutil pyyaml packaging
  HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 \
  HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS="-j$(nproc)" \
    "$hvd/bin/pip" install -q --no-build-isolation --no-cache-dir "horovod==$horovod_version"
fi
"$hvd/bin/horovodrun" --check-build | grep -E "PyTorch|Gloo|MPI" | head -6

if [ ! -x "$torch2/bin/python" ]; then
  /usr/bin/python3 -m venv --system-site-packages "$torch2"
  "$torch2/bin/pip" install -q "torch==$torch2_version"
fi
if ! "$torch2/bin/python" -c "import deepspeed" 2>/dev/null; then
  echo "installing DeepSpeed $deepspeed_version into $torch2"
  DS_BUILD_OPS=0 "$torch2/bin/pip" install -q "deepspeed==$deepspeed_version"
fi
DS_ACCELERATOR=cpu "$torch2/bin/python" -c \
  "import torch, deepspeed; print('torch', torch.__version__, 'deepspeed', deepspeed.__version__)"
