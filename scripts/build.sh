#!/usr/bin/env bash
# Configures and builds chorus into ./build (Release, -j2 by default).
set -euo pipefail
cd "$(dirname "$0")/.."
# CHORUS_TF_PYTHON (scripts/tf-venv.sh prints one): also build the TensorFlow ops.
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release ${CHORUS_TF_PYTHON:+-DCHORUS_TF_PYTHON="$CHORUS_TF_PYTHON"} >/dev/null
cmake --build build -j"${JOBS:-2}"
