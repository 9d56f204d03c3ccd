"""Where save_checkpoint's files go: written at once (Writer), or copied into memory now and
written by a background thread (Snapshot: save_checkpoint(async_save=True), checkpoint.async).

An asynchronous save is committed in the foreground: while one is in flight, every step
boundary asks all ranks (one small allgather) whether their writes are done; once they all
are, `latest` is written; a failed write is raised there on every rank, naming the ranks,
and `latest` keeps naming the last complete save. A later save, wait_for_checkpoint() and
destroy() wait for it."""
import atexit
import io
import threading
import time
import weakref

import torch

import chorus.torch as hvd
from chorus import _core


class Writer:
    """Writes each file now, atomically."""
    deferred = False

    def shard(self, core, path, identity):
        core.save_shard(path, identity)

    def file(self, path, meta, blobs):
        _core.write_checkpoint_file(path, meta, blobs)

    def raw(self, path, data):
        _core.write_file_atomic(path, data)

    def pickled(self, path, obj, save=None):
        """torch.save(obj) (or save(obj, file)) to path, atomically."""
        buf = io.BytesIO()
        (save or torch.save)(obj, buf)
        _core.write_file_atomic(path, buf.getvalue())


class Snapshot(Writer):
    """Copies each file's contents into memory now; start() writes them on a thread."""
    deferred = True

    def __init__(self):
        self.items, self.nbytes = [], 0
        self.thread, self.error, self.seconds = None, None, 0.0

    def _add(self, path, item, nbytes):
        self.items.append((path, item))
        self.nbytes += nbytes

    def shard(self, core, path, identity):
        # Into the buffer this engine's last asynchronous save used (kept, as pinned buffers are
        # kept: a second copy of the shard in host memory), so that the copy is all the step waits for.
        buffers = _buffers(core)
        f = buffers.get(id(core))
        if f is None:
            f = buffers[id(core)] = _core.CheckpointFile("", {})
        core.shard_snapshot_into(f, identity)
        self._add(path, f, f.nbytes)

    def file(self, path, meta, blobs):
        f = _core.CheckpointFile(meta, blobs)
        self._add(path, f, f.nbytes)

    def raw(self, path, data):
        self._add(path, bytes(data), len(data))

    def pickled(self, path, obj, save=None):
        buf = io.BytesIO()
        (save or torch.save)(obj, buf)
        self._add(path, buf.getvalue(), buf.tell())

    def _write(self):
        t0 = time.perf_counter()
        try:
            for path, item in self.items:
                write_one(path, item)
        except BaseException as e:  # noqa: BLE001 (raised in the foreground, at the commit)
            self.error = e
        finally:
            self.items = []  # (the memory goes as soon as the files are written)
            self.seconds = time.perf_counter() - t0

    def start(self):
        # Not a daemon: a script that ends with an asynchronous save still gets its files (see _at_exit).
        self.thread = threading.Thread(target=self._write, name="chorus-checkpoint-writer")
        self.thread.start()


_SNAPSHOT_BUFFERS = {}


def _buffers(core):
    """{id(core): its snapshot buffer}, dropped with the engine's core."""
    import weakref
    key = id(core)
    if key not in _SNAPSHOT_BUFFERS:
        _SNAPSHOT_BUFFERS[key] = {}
        try:
            weakref.finalize(core, _SNAPSHOT_BUFFERS.pop, key, None)
        except TypeError:  # (a core that takes no weak reference keeps its buffer for the process)
            pass
    return _SNAPSHOT_BUFFERS[key]


def write_one(path, item):
    """One snapshotted file (a module function: a test may slow or break it)."""
    if isinstance(item, bytes):
        _core.write_file_atomic(path, item)
    else:
        item.write(path)


class Pending:
    """A save in flight: its snapshot, and what to write once every rank's files are down."""

    def __init__(self, snapshot, tag, commit, across=None):
        self.snapshot, self.tag, self.commit, self.across = snapshot, tag, commit, across
        _IN_FLIGHT.add(self)


_IN_FLIGHT = weakref.WeakSet()


@atexit.register
def _at_exit():
    """An asynchronous save still in flight at exit: its files are written (the thread is
    joined), but `latest` needs every rank's word, which a collective at exit cannot give."""
    for pending in list(_IN_FLIGHT):
        if pending.snapshot.thread is not None and pending.snapshot.thread.is_alive():
            pending.snapshot.thread.join()
        import warnings
        warnings.warn(f"save_checkpoint: the asynchronous save of tag '{pending.tag}' was written but not "
                      "committed ('latest' still names the save before it): call engine.wait_for_checkpoint() "
                      "(or destroy()) before the script ends")


def async_requested(engine, async_save):
    if async_save is not None:
        return bool(async_save)
    return bool((engine._raw_config.get("checkpoint") or {}).get("async", False))


def poll(engine, block):
    """Commits the save in flight once every rank's writes are done (block: wait for them).
    Collective over the engine's process set while a save is in flight."""
    pending = getattr(engine, "_pending_save", None)
    if pending is None:
        return
    snap = pending.snapshot
    if block:
        snap.thread.join()
    state = 0 if snap.thread.is_alive() else (2 if snap.error is not None else 1)
    ps = engine.process_set
    states = hvd.allgather(torch.tensor([state], dtype=torch.int32), name="ckpt.async.poll",
                           process_set=ps).tolist()
    failed, running = int(2 in states), int(0 in states)
    if pending.across is not None and pending.across.size() > 1:  # the other tensor/pipeline slices' sets
        failed, running = hvd.allreduce(torch.tensor([failed, running], dtype=torch.int32), op=hvd.Max,
                                        process_set=pending.across, name="ckpt.async.poll.slices").tolist()
    if failed:
        engine._pending_save = None
        _IN_FLIGHT.discard(pending)
        bad = [r for r, s in enumerate(states) if s == 2]
        why = f": {snap.error}" if snap.error is not None else ""
        raise RuntimeError(f"save_checkpoint: the asynchronous save of tag '{pending.tag}' failed on "
                           f"{f'rank(s) {bad} of the process set' if bad else 'another slice'}{why}; 'latest' "
                           "still names the last complete save") from snap.error
    if running:
        return
    engine._pending_save = None
    _IN_FLIGHT.discard(pending)
    commit(engine, pending.commit, pending.across)


def commit(engine, write, across=None):
    """Writes what names the save (rank 0's `latest`); every rank learns whether it could, and
    returns with it written (the agreement is collective)."""
    from chorus.deepspeed.runtime.zero.checkpoint_common import _agree
    error = None
    try:
        write()
    except Exception as e:  # noqa: BLE001 (rank 0's failure is every rank's, not a wait)
        error = e
    _agree(engine.process_set, error, "writing 'latest'", across)


def wait(engine):
    """Waits for the save in flight and commits it (collective)."""
    poll(engine, block=True)
