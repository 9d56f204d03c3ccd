#!/usr/bin/env bash
# Makes (once) the venv where chorus meets the frameworks that drive DeepSpeed and
# start torch.distributed jobs: PyTorch 2 (torchrun), Hugging Face Transformers and
# Accelerate, Lightning, Ray and Spark. Debian's interpreter (chorus's extension is built for it),
# without Debian's site-packages (their torch 1.13 and torchvision 0.14 would mix in).
# pip's cache keeps a rerun cheap. Prints the venv's python.
# Usage: bash scripts/torch2-venv.sh   (CHORUS_TORCH2_VENV overrides the folder)
set -euo pipefail
cd "$(dirname "$0")/.."
venv="$(realpath -m "${CHORUS_TORCH2_VENV:-build/venv-torch2}")"
py="$venv/bin/python"
# Transformers 5 needs torch >= 2.6. Ray (Train) and PySpark (with Connect's client) are
# the cluster engines chorus.ray and chorus.spark start jobs from. TensorBoard, wandb and comet: the
# monitors a DeepSpeed config switches on.
pins=(torch==2.9.1 transformers==5.25.0 accelerate==1.15.0 lightning==2.6.6 numpy pytest
  "ray[train]==2.60.0" "pyspark[connect]==4.3.0" "pandas<3" tensorboard==2.21.0 wandb==0.31.0 comet_ml==3.58.8)
want="${pins[*]}"
if [ "$(cat "$venv/.pins" 2>/dev/null)" != "$want" ]; then
  mkdir -p "$(dirname "$venv")"
  [ -x "$py" ] || /usr/bin/python3 -m venv "$venv"
  echo "installing ${pins[*]} into $venv" >&2
  "$py" -m pip install -q --disable-pip-version-check "${pins[@]}" >&2
  echo "$want" > "$venv/.pins"
fi

# Overlays: folders put first on PYTHONPATH over the venv's torch (no second torch).
#   overlays/hf4        Transformers 4.48 and Accelerate 1.3, as many projects still pin them
#   overlays/deepspeed  the real DeepSpeed, the reference chorus.deepspeed is checked against
#                       (DS_ACCELERATOR=cpu; its CPU ops build at first use, under torch_extensions)
overlay() {
  local name="$1"
  shift
  local dir="$venv/overlays/$name"
  if [ "$(cat "$dir/.pins" 2>/dev/null)" != "$*" ]; then
    echo "installing $* into $dir" >&2
    rm -rf "$dir"
    DS_BUILD_OPS=0 "$py" -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation \
      --target "$dir" "$@" >&2
    echo "$*" > "$dir/.pins"
  fi
}
overlay hf4 transformers==4.48.3 accelerate==1.3.0 huggingface-hub==0.36.2 tokenizers==0.21.4 \
  requests==2.34.2 urllib3==2.8.0 idna==3.21 charset-normalizer==3.5.3 certifi==2026.10.19.post1
overlay deepspeed deepspeed==0.19.8 hjson==3.1.0 py-cpuinfo==9.0.0 ninja==1.13.2 msgpack==1.2.4 einops==0.8.2 \
  nvidia-ml-py==13.615.71
echo "$py"
