#!/usr/bin/env bash
# Configures and builds chorus into ./build (Release, -j2 by default): every target, or the
# targets named (bash scripts/build.sh chorus_python_package).
set -euo pipefail
cd "$(dirname "$0")/.."
# CHORUS_TF_PYTHON (scripts/tf-venv.sh prints one): also build the TensorFlow ops.
# CHORUS_TORCH2_PYTHON (scripts/torch2-venv.sh): also run the tests under torchrun, Transformers, Accelerate, Lightning.
# CI (CI set): warnings are errors.
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release ${CI:+-DCHORUS_WERROR=ON} ${CHORUS_TF_PYTHON:+-DCHORUS_TF_PYTHON="$CHORUS_TF_PYTHON"} \
  ${CHORUS_TORCH2_PYTHON:+-DCHORUS_TORCH2_PYTHON="$CHORUS_TORCH2_PYTHON"} >/dev/null
cmake --build build -j"${JOBS:-2}" ${1:+--target "$@"}
