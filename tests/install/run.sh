#!/usr/bin/env bash
# Installs chorus into a temporary prefix, builds consumers with find_package (the
# libtorch one too where chorus_torch was built), runs them on 2 ranks.
set -euo pipefail
build=$1 src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
want_torch=OFF
[ -n "$(find "$tmp/prefix" -name chorusTorchTargets.cmake)" ] && want_torch=ON
cmake -S "$src/tests/install" -B "$tmp/consumer" -DCMAKE_PREFIX_PATH="$tmp/prefix" -DWANT_TORCH=$want_torch >/dev/null
cmake --build "$tmp/consumer" -j2 >/dev/null
"$tmp/prefix/bin/chorusrun" -np 2 "$tmp/consumer/consumer"
if [ "$want_torch" = ON ]; then
  "$tmp/prefix/bin/chorusrun" -np 2 "$tmp/consumer/torch_consumer" | tee "$tmp/out"
  test "$(grep -c 'torch sum 3.0' "$tmp/out")" = 2
fi
