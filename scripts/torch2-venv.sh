#!/usr/bin/env bash
# Makes (once) the venv where chorus meets the frameworks that drive DeepSpeed and
# start torch.distributed jobs: PyTorch 2 (torchrun), Hugging Face Transformers and
# Accelerate, Lightning. Debian's interpreter (chorus's extension is built for it),
# without Debian's site-packages (their torch 1.13 and torchvision 0.14 would mix in).
# pip's cache keeps a rerun cheap. Prints the venv's python.
# Usage: bash scripts/torch2-venv.sh   (CHORUS_TORCH2_VENV overrides the folder)
set -euo pipefail
cd "$(dirname "$0")/.."
venv="$(realpath -m "${CHORUS_TORCH2_VENV:-build/venv-torch2}")"
py="$venv/bin/python"
# Transformers 5 needs torch >= 2.6.
pins=(torch==2.9.1 transformers==5.25.0 accelerate==1.15.0 lightning==2.6.6 numpy pytest)
want="${pins[*]}"
if [ "$(cat "$venv/.pins" 2>/dev/null)" != "$want" ]; then
  mkdir -p "$(dirname "$venv")"
  [ -x "$py" ] || /usr/bin/python3 -m venv "$venv"
  echo "installing ${pins[*]} into $venv" >&2
  "$py" -m pip install -q --disable-pip-version-check "${pins[@]}" >&2
  echo "$want" > "$venv/.pins"
fi
echo "$py"
