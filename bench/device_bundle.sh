#!/bin/bash
# Packs what bench/sixteen_ranks.sh needs on a machine without chorus's build
# dependencies (the lent 16-core machine: Ubuntu userland with its own Open MPI,
# no Gloo, no internet) into build/device-bundle: the two programs, libchorus,
# and the shared libraries that machine may lack. Its MPI libraries are not
# packed: the bench must use the same Open MPI as that machine's mpirun.
#   bash bench/device_bundle.sh            (after scripts/build.sh)
# then carry build/device-bundle to the machine and run bench/sixteen_ranks.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
out=$build/device-bundle
for f in chorusrun chorus-bench; do
  [[ -x $build/$f ]] || { echo "device_bundle.sh: $build/$f missing: run scripts/build.sh first" >&2; exit 1; }
done
rm -rf "$out.tmp" && mkdir -p "$out.tmp/bin"
cp "$build/chorusrun" "$build/chorus-bench" "$out.tmp/bin/"
bash scripts/pack-libs.sh "$out.tmp" "$build/chorusrun" "$build/chorus-bench"  # (sixteen_ranks.sh checks with ldd)
git rev-parse HEAD > "$out.tmp/COMMIT" 2>/dev/null || true
rm -rf "$out" && mv "$out.tmp" "$out"
du -sh "$out"
