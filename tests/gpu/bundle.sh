#!/bin/bash
# Packs the GPU suite for the lent GPU machine (no chorus build dependencies,
# no internet) into build/gpu-bundle: chorusrun, libchorus, libchorus_cuda, the
# C++ GPU tests, the libraries that machine may lack, and what compiling the
# Python extension there needs (bindings, headers). Then, from the repository:
#   bash tests/gpu/bundle.sh        (here, after scripts/build.sh)
#   bash tests/gpu/run.sh           (there, with build/gpu-bundle carried)
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${BUILD_DIR:-build}
out=$build/gpu-bundle
cmake --build "$build" -j"${JOBS:-2}" --target chorusrun chorus chorus_cuda chorus_gpu_tests >/dev/null
rm -rf "$out.tmp" && mkdir -p "$out.tmp/bin" "$out.tmp/lib"
cp "$build/chorusrun" "$build/tests/chorus_gpu_tests" "$out.tmp/bin/"
cp -L "$build/libchorus_cuda.so" "$out.tmp/lib/"
bash scripts/pack-libs.sh "$out.tmp" "$build/chorusrun" "$build/tests/chorus_gpu_tests" "$build/libchorus_cuda.so"
git rev-parse HEAD > "$out.tmp/COMMIT" 2>/dev/null || true
rm -rf "$out" && mv "$out.tmp" "$out"
du -sh "$out"
