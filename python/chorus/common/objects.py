"""Python objects across ranks (pickled into uint8 arrays), for any frontend."""
import pickle

import numpy as np

from chorus import _core

_UINT8, _INT64 = 0, 3  # chorus's dtype codes


def _ptr(a):
    return a.ctypes.data


def dumps(obj):
    return np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), dtype=np.uint8).copy()


def broadcast_object(obj, root_rank=0, name="object", set_id=0):
    """root_rank's obj on every rank of the set."""
    root = _core.rank() == root_rank
    payload = dumps(obj) if root else None
    size = np.array([payload.size if root else 0], dtype=np.int64)
    _core.broadcast_async(_ptr(size), _ptr(size), _INT64, [1], root_rank, f"broadcast_object.{name}.size",
                          set_id, 0, True)
    if not root:
        payload = np.empty(int(size[0]), dtype=np.uint8)
    _core.broadcast_async(_ptr(payload), _ptr(payload), _UINT8, [payload.size], root_rank,
                          f"broadcast_object.{name}.data", set_id, 0, True)
    return obj if root else pickle.loads(payload.tobytes())


def _allgather(a, dtype, name, set_id):
    w = _core.grouped_allgather_async([_ptr(a)], [dtype], [[a.size]], name, set_id, 0, True)
    return w.output_bytes(0)


def allgather_object(obj, name="object", set_id=0):
    """Every rank's obj, in rank order."""
    payload = dumps(obj)
    sizes = _allgather(np.array([payload.size], dtype=np.int64), _INT64, f"allgather_object.{name}.size", set_id)
    data = _allgather(payload, _UINT8, f"allgather_object.{name}.data", set_id)
    out, off = [], 0
    for s in sizes.view(np.int64).tolist():
        out.append(pickle.loads(data[off:off + s].tobytes()))
        off += s
    return out
