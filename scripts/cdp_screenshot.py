"""Screenshots a page in a running headless Chromium once the page shows some
text, over the DevTools protocol (a viewer that loads its data in a worker is
not done at the load event that `chromium --screenshot` waits for).

    cdp_screenshot.py DEVTOOLS_PORT URL TEXT PNG
"""
import base64
import json
import sys
import time
import urllib.request

import websocket  # websocket-client (PyPI)


def main():
    port, url, want, png = sys.argv[1:5]
    for _ in range(100):
        try:
            pages = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json"))
            break
        except OSError:
            time.sleep(0.1)
    else:
        sys.exit(f"no DevTools endpoint on 127.0.0.1:{port}")
    page = next(p for p in pages if p.get("type") == "page")
    ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=60)
    ids = iter(range(1, 1 << 30))

    def call(method, **params):
        i = next(ids)
        ws.send(json.dumps({"id": i, "method": method, "params": params}))
        while True:
            m = json.loads(ws.recv())
            if m.get("id") == i:
                return m.get("result", {})

    call("Page.enable")
    call("Page.navigate", url=url)
    deadline, text = time.time() + 60, ""
    while time.time() < deadline:
        r = call("Runtime.evaluate", expression="document.body ? document.body.innerText : ''", returnByValue=True)
        text = r.get("result", {}).get("value", "")
        if want in text and "Opening trace" not in text:
            break
        time.sleep(0.5)
    else:
        sys.exit(f"the page never showed {want!r}; it shows: {text[:300]!r}")
    time.sleep(2)  # the last frames drawn
    with open(png, "wb") as f:
        f.write(base64.b64decode(call("Page.captureScreenshot", format="png")["data"]))
    print("wrote", png)


if __name__ == "__main__":
    main()
