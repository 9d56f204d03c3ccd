#!/usr/bin/env bash
# Installs chorus into a temporary prefix, builds a consumer with find_package, runs it on 2 ranks.
set -euo pipefail
build=$1 src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
cmake -S "$src/tests/install" -B "$tmp/consumer" -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null
cmake --build "$tmp/consumer" >/dev/null
"$tmp/prefix/bin/chorusrun" -np 2 "$tmp/consumer/consumer"
