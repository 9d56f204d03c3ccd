"""The child process of one rank: python -m chorus.runner.child PAYLOAD RESULT PICKLER.

Reads (fn, args, kwargs) from PAYLOAD, runs fn, and writes its result, or the
exception's message and traceback, to RESULT (atomically). It dies with its
parent: its standard input is a pipe from the parent, and the pipe's end (the
parent gone, even killed) ends the child's whole process group.
"""
import importlib
import os
import pickle
import signal
import sys
import threading
import time
import traceback

from chorus.runner.rank_process import remove_segments


def _remove_segments():
    # Only this process's: other ranks of the job on this host may still use theirs.
    remove_segments(os.environ.get("CHORUS_JOB_ID", ""), os.getpid())


def _watch_parent():
    try:
        while os.read(0, 4096):
            pass
    except OSError:
        pass
    # The parent is gone (or closed the pipe to stop this rank): the group goes too.
    _remove_segments()
    os.killpg(0, signal.SIGKILL)


def _write(path, record):
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        pickle.dump(record, f)
    os.replace(tmp, path)


def main():
    payload, result, pickler = sys.argv[1:4]
    threading.Thread(target=_watch_parent, daemon=True, name="chorus-parent-watch").start()
    cloudpickle = importlib.import_module(pickler)
    try:
        with open(payload, "rb") as f:
            fn, args, kwargs = cloudpickle.loads(f.read())
        value = fn(*args, **kwargs)
        record = {"ok": True, "value": cloudpickle.dumps(value)}
    except BaseException as e:  # noqa: BLE001 - the driver reports every failure
        record = {"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc(),
                  "time": time.time()}
    sys.stdout.flush()
    sys.stderr.flush()
    _write(result, record)
    # chorus's shutdown runs at exit; a rank whose peers failed must not linger in it.
    try:
        chorus_core = sys.modules.get("chorus._core")
        if chorus_core is not None and chorus_core.is_initialized():
            chorus_core.shutdown()
    except Exception:  # noqa: BLE001 - the result is written; exit regardless
        pass
    os._exit(0 if record["ok"] else 1)


if __name__ == "__main__":
    main()
