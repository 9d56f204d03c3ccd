"""What runs inside each Ray worker of a chorus job (an actor of RayExecutor, or a
Ray Train worker): its chorus variables, rank 0's held port, the end of the job."""
import os

import ray

from chorus import _core

_held = None  # rank 0's port, held from its choice until the store listens on it (and after)


def node_info():
    """(Ray node id, the node's address, pid): ranks of one node are one host to chorus."""
    return ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address(), os.getpid()


def hold_port():
    global _held
    _held = _core.hold_free_port()
    return _held.port


def set_env(env):
    os.environ.update({k: str(v) for k, v in env.items()})


def remove_segments(job, pid=None):
    """Unlinks the job's shared-memory segments on this node (pid's only, or all once
    no worker of the job runs here); returns how many."""
    from chorus.runner.rank_process import remove_segments as remove
    return remove(job, pid)


def end_job():
    """Shuts chorus down in this worker and removes the job's shared memory."""
    global _held
    if _core.is_initialized():
        _core.shutdown()
    remove_segments(os.environ.get("CHORUS_JOB_ID", ""), os.getpid())
    if _held is not None:
        _held.release()
        _held = None
    for key in [k for k in os.environ if k.startswith("CHORUS_")]:
        del os.environ[key]
