#!/usr/bin/env bash
# Makes (once) the venv that chorus.tensorflow is built and tested with:
# TensorFlow from PyPI (tensorflow-cpu, with Keras 3, and tf_keras: Keras 2, which
# tf.keras is under TF_USE_LEGACY_KERAS=1) on Debian's interpreter.
# Debian's site-packages stay out: TensorFlow needs NumPy 2, which Debian's
# SciPy/scikit-learn (imported by Keras) cannot load, so those come from PyPI too.
# pip's cache keeps a rerun cheap. Prints the venv's python.
# Usage: bash scripts/tf-venv.sh   (CHORUS_TF_VENV, CHORUS_TF_VERSION override)
set -euo pipefail
cd "$(dirname "$0")/.."
version="${CHORUS_TF_VERSION:-2.21.0}"
venv="$(realpath -m "${CHORUS_TF_VENV:-build/venv-tf}")"
py="$venv/bin/python"
if ! "$py" -c "import tensorflow as tf, tf_keras, sys; sys.exit(tf.__version__ != '$version')" 2>/dev/null; then
  mkdir -p "$(dirname "$venv")"
  [ -x "$py" ] || /usr/bin/python3 -m venv "$venv"
  echo "installing tensorflow-cpu==$version into $venv" >&2
  "$py" -m pip install -q --disable-pip-version-check "tensorflow-cpu==$version" "tf_keras==$version" scikit-learn pytest >&2
fi
echo "$py"
