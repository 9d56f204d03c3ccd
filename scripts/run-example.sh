#!/usr/bin/env bash
# Newcomer command 1: install what is missing, build, and train an MLP on the
# handwritten digits with PyTorch on 2 local ranks (Debian's /usr/bin/python3 has torch).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
# Only what the example runs: the Python package (libchorus, its extension, chorusrun).
bash scripts/build.sh chorus_python_package
PYTHONPATH=build/python ./build/chorusrun -np 2 /usr/bin/python3 examples/pytorch/digits.py
