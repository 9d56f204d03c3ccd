"""Runs one rank's function in a child process (see chorus.runner.child)."""
import glob
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import time


def remove_segments(job_id, pid=None):
    """Unlinks the job's shared-memory segments on this host: those process pid made
    (chorus names them /chorus-<job>-<pid>-...), or with pid None every one of the job's
    (only when no rank of the job runs on this host any more). Returns how many."""
    if not job_id:
        return 0
    n = 0
    for path in glob.glob(f"/dev/shm/chorus-{job_id}-{pid}-*" if pid else f"/dev/shm/chorus-{job_id}-*"):
        try:
            os.unlink(path)
            n += 1
        except OSError:
            pass
    return n


def rank_env(rank, size, hosts, rendezvous, secret, job_id, extra=None):
    """chorus's variables for rank `rank` of a job whose ranks run on `hosts`
    (rank order; equal names share a host). rendezvous: (address, port) of the
    store rank 0 serves."""
    host = hosts[rank]
    order = list(dict.fromkeys(hosts))  # hosts in the order of their first rank
    local = [r for r, h in enumerate(hosts) if h == host]
    env = {
        "CHORUS_RANK": str(rank), "CHORUS_SIZE": str(size),
        "CHORUS_LOCAL_RANK": str(local.index(rank)), "CHORUS_LOCAL_SIZE": str(len(local)),
        "CHORUS_CROSS_RANK": str(order.index(host)), "CHORUS_CROSS_SIZE": str(len(order)),
        "CHORUS_HOSTNAME": host,
        "CHORUS_RENDEZVOUS_ADDR": rendezvous[0], "CHORUS_RENDEZVOUS_PORT": str(rendezvous[1]),
        "CHORUS_RENDEZVOUS_SERVER": "rank0", "CHORUS_SECRET": secret, "CHORUS_JOB_ID": job_id,
        # torch-style names that DeepSpeed and Lightning code read
        "LOCAL_RANK": str(local.index(rank)), "LOCAL_WORLD_SIZE": str(len(local)),
    }
    env.update(extra or {})
    return env


class RankProcess:
    """fn(*args, **kwargs) in a child process with `env` added to this one's.

    capture: its output goes to files (read with output()) instead of this
    process's own stdout and stderr. pickler: the cloudpickle module that
    serialised nothing yet but will (pyspark.cloudpickle, ray.cloudpickle)."""

    def __init__(self, fn, args, kwargs, env, pickler, executable=None, capture=False):
        cloudpickle = __import__(pickler, fromlist=["dumps"])
        self._dir = tempfile.mkdtemp(prefix="chorus-rank-")
        self._result = os.path.join(self._dir, "result")
        payload = os.path.join(self._dir, "payload")
        with open(payload, "wb") as f:
            f.write(cloudpickle.dumps((fn, tuple(args), dict(kwargs))))
        full = dict(os.environ)
        full.update({k: str(v) for k, v in env.items()})
        # The child imports what this process imports (chorus, the user's modules).
        paths = [p for p in sys.path if p] + [full.get("PYTHONPATH", "")]
        full["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
        self.job_id = full.get("CHORUS_JOB_ID", "")
        out = err = None
        if capture:
            out = open(os.path.join(self._dir, "stdout"), "wb")
            err = open(os.path.join(self._dir, "stderr"), "wb")
        try:
            self._proc = subprocess.Popen(
                [executable or sys.executable, "-m", "chorus.runner.child", payload, self._result, pickler],
                env=full, stdin=subprocess.PIPE, stdout=out, stderr=err, start_new_session=True)
        finally:
            for f in (out, err):
                if f:
                    f.close()
        self._capture = capture

    @property
    def pid(self):
        return self._proc.pid

    def poll(self):
        return self._proc.poll()

    def wait(self, timeout=None):
        """The child's record: {"ok": True, "value": bytes} or {"ok": False, "error", "traceback"}."""
        try:
            code = self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        return self._record(code)

    def _record(self, code):
        try:
            with open(self._result, "rb") as f:
                return pickle.load(f)
        except (OSError, EOFError, pickle.UnpicklingError):
            pass
        if code is not None and code < 0:
            name = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else str(-code)
            what = f"was killed by signal {-code} ({name})"
        else:
            what = f"exited with code {code} before returning"
        return {"ok": False, "error": f"the rank's process {what}", "traceback": "", "time": time.time()}

    def output(self):
        """(stdout, stderr) as text, when captured."""
        if not self._capture:
            return "", ""
        texts = []
        for name in ("stdout", "stderr"):
            try:
                with open(os.path.join(self._dir, name), "rb") as f:
                    texts.append(f.read().decode(errors="replace"))
            except OSError:
                texts.append("")
        return tuple(texts)

    def kill(self):
        """Ends the child and every process it started (even after the child itself exited)."""
        try:
            os.killpg(self._proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self._proc.wait()

    def close(self):
        """Kills what is left, removes the shared memory the child made and the files
        (other ranks of the job on this host may still use theirs)."""
        self.kill()
        if self._proc.stdin:
            self._proc.stdin.close()
        remove_segments(self.job_id, self._proc.pid)
        shutil.rmtree(self._dir, ignore_errors=True)


def load_value(record, pickler):
    cloudpickle = __import__(pickler, fromlist=["loads"])
    return cloudpickle.loads(record["value"])
