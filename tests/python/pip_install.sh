#!/usr/bin/env bash
# pip install . into a venv made from Debian's Python (with its torch), then run
# a 2-rank job with the installed chorusrun, from outside the source tree.
set -euo pipefail
src=$1 python=${2:-/usr/bin/python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$python" -m venv --system-site-packages "$tmp/venv"
"$tmp/venv/bin/pip" install -q --no-build-isolation --no-deps "$src"
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
"$tmp/venv/bin/chorus-zero-to-fp32" --help | grep -q "consolidates"
