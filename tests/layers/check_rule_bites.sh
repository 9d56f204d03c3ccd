#!/usr/bin/env bash
# The layer check passes on the tree and fails, naming the file, on a copy with
# an upward include planted in each lower layer (so a broken rule cannot pass).
set -euo pipefail
src="$1"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cmake -DSOURCE_DIR="$src" -P "$src/cmake/check_layers.cmake"
plant() {  # layer file header
  rm -rf "$tmp/tree"; mkdir -p "$tmp/tree"; cp -r "$src/src" "$src/cmake" "$tmp/tree/"
  printf '#include "%s"\n' "$3" >> "$tmp/tree/src/$1/$2"
  if out=$(cmake -DSOURCE_DIR="$tmp/tree" -P "$tmp/tree/cmake/check_layers.cmake" 2>&1); then
    echo "FAIL: src/$1/$2 including $3 passed the check"; exit 1
  fi
  grep -q "src/$1/$2: $3" <<<"$out" || { echo "FAIL: the error does not name src/$1/$2: $out"; exit 1; }
}
plant comm factory.cc core/runtime_impl.h
plant rendezvous tcp_store_server.cc core/controller.h
plant device loader.cc zero/engine.h
plant launcher main.cc core/runtime_impl.h
plant base logging.cc reduce/reduce.h
plant reduce reduce.cc device/device_backend.h
plant core runtime.cc comm/shm/shared_pool.h
plant base wire.cc chorus/runtime.h
echo "the layer check refuses every planted include"
