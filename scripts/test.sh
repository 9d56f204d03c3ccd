#!/usr/bin/env bash
# Newcomer command 2 (and CI): install what is missing, build, run every test.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
# The C++ core builds while the venvs below download (their time is mostly the network's);
# the TensorFlow ops, which need the TF venv, build after.
mkdir -p build
bash scripts/build.sh > build/core-build.log 2>&1 &
core=$!
trap 'kill "$core" 2>/dev/null || true' EXIT  # (a failed venv does not leave the build running)
# TensorFlow (PyPI's tensorflow-cpu) in a venv of its own, for chorus.tensorflow.
CHORUS_TF_PYTHON="$(bash scripts/tf-venv.sh)"
export CHORUS_TF_PYTHON
# PyTorch 2 with Transformers, Accelerate and Lightning (PyPI) in a venv of its own.
CHORUS_TORCH2_PYTHON="$(bash scripts/torch2-venv.sh)"
export CHORUS_TORCH2_PYTHON
if ! wait "$core"; then
  cat build/core-build.log
  echo "the build failed (above)" >&2
  exit 1
fi
trap - EXIT
tail -3 build/core-build.log
# The real DeepSpeed's CPU ops, which its reference tests load, built ahead (two at a time).
bash scripts/deepspeed-ops.sh "$CHORUS_TORCH2_PYTHON"
bash scripts/build.sh
cd build
ctest --output-on-failure -j"${JOBS:-2}" --timeout 600
