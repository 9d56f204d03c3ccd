#!/usr/bin/env bash
# The packaging path a user takes: an sdist of the source tree, `pip wheel` of that
# sdist (a full C++ build from what the sdist carries), the wheel installed into a
# fresh venv from Debian's Python (with its torch), then a 2-rank job with the
# installed chorusrun from outside the source tree; the console scripts answer.
set -euo pipefail
src=$1 python=${2:-/usr/bin/python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$python" -m venv --system-site-packages "$tmp/venv"
pip="$tmp/venv/bin/pip"
# The sdist from a copy of the tracked files (so a developer's build folders stay out).
git -C "$src" ls-files -z | (cd "$src" && tar --null -T - -cf -) | (mkdir "$tmp/src" && tar -xf - -C "$tmp/src")
(cd "$tmp/src" && "$tmp/venv/bin/python" setup.py -q sdist -d "$tmp/dist" >/dev/null 2>&1)
sdist=$(ls "$tmp"/dist/chorus-*.tar.gz)
tar -tzf "$sdist" > "$tmp/sdist.txt"
grep -q "chorus-[0-9.]*/CMakeLists.txt" "$tmp/sdist.txt"
grep -q "chorus-[0-9.]*/src/core/runtime.cc" "$tmp/sdist.txt"
"$pip" wheel -q --no-build-isolation --no-deps -w "$tmp/wheels" "$sdist"
"$pip" install -q --no-deps "$tmp"/wheels/chorus-*.whl
cd "$tmp"
cat > job.py <<'PY'
import torch
import chorus.torch as hvd
hvd.init()
out = hvd.allreduce(torch.ones(3) * (hvd.rank() + 1), op=hvd.Sum)
assert out.tolist() == [3.0] * 3, out
print("installed chorus works on rank", hvd.rank())
hvd.shutdown()
PY
"$tmp/venv/bin/chorusrun" -np 2 "$tmp/venv/bin/python" job.py | tee out.txt
test "$(grep -c 'installed chorus works' out.txt)" = 2
# A .py script runs under the Python that runs chorusrun (the venv's), not PATH's first python3.
echo 'import sys; print("runs under", sys.executable)' > which.py
PATH=/usr/bin:/bin "$tmp/venv/bin/chorusrun" -np 1 which.py > which.txt
grep -q "runs under $tmp/venv/bin/python" which.txt
"$tmp/venv/bin/chorusrun" --version > version.txt
grep -q "^chorus [0-9]" version.txt
"$tmp/venv/bin/chorus-zero-to-fp32" --help > help.txt
grep -q "consolidates" help.txt
echo "sdist, wheel and install: ok"
