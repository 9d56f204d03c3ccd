#!/usr/bin/env bash
# Newcomer command 2 (and CI): install what is missing, build, run every test.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
cd build
ctest --output-on-failure -j"${JOBS:-2}" --timeout 600
