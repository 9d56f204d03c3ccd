"""The elastic loop's committed state and its run() loop, for every frontend:
state is saved at commit(), restored after a failure, and synchronized from
rank 0 after every reset."""
import copy
import functools
import sys

from chorus import _core
from chorus.common import basics
from chorus.common.objects import broadcast_object


class HostsUpdatedInterrupt(RuntimeError):
    """Raised by commit()/check_host_updates() on every rank at once when the
    driver's host set changed; skip_sync: hosts were only removed, so the state
    every survivor holds is already the same."""

    def __init__(self, skip_sync):
        super().__init__("the job's hosts changed" + (" (removed only)" if skip_sync else ""))
        self.skip_sync = skip_sync


class State:
    def __init__(self, bcast_object=broadcast_object, get_rank=basics.rank):
        self._bcast_object = bcast_object
        self._rank = get_rank
        self._last_updated = 0
        self._reset_callbacks = []

    def register_reset_callbacks(self, callbacks):
        """Functions called after every reset (the world size may have changed)."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        self._last_updated = 0  # the new round includes every change so far
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def commit(self):
        """Saves the state (the point a failure rolls back to), then checks for new hosts."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self):
        """Raises HostsUpdatedInterrupt, on every rank at once, when hosts were added
        or removed since the last check. Rank 0's view decides for all."""
        count, removed_only = _core.elastic_host_updates()
        prev, last, removed_only = self._bcast_object((self._last_updated, count, removed_only))
        self._last_updated = last
        if last > prev:
            raise HostsUpdatedInterrupt(bool(removed_only))

    def save(self):
        raise NotImplementedError()

    def restore(self):
        raise NotImplementedError()

    def sync(self):
        raise NotImplementedError()

    def reset(self):
        pass


class ObjectState(State):
    """State made of attributes given as keyword arguments (epoch=0, batch=0, ...)."""

    def __init__(self, bcast_object=broadcast_object, get_rank=basics.rank, **kwargs):
        self._saved_state = copy.deepcopy(kwargs)
        self._set_attrs()
        super().__init__(bcast_object=bcast_object, get_rank=get_rank)

    def save(self):
        self._saved_state = {k: copy.deepcopy(getattr(self, k)) for k in self._saved_state}

    def restore(self):
        self._set_attrs()

    def sync(self):
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()

    def _set_attrs(self):
        for k, v in self._saved_state.items():
            setattr(self, k, copy.deepcopy(v))



_process_sets_fn = None


def set_process_sets(fn):
    """fn(size) -> the process_sets argument for init() after a reset: a list of
    ProcessSet, or "dynamic". Without it, a reset keeps what the first init got:
    "dynamic" stays dynamic (re-add dynamic sets in a reset callback), and static
    sets keep those of their ranks that the new world still has (a set left empty
    is dropped)."""
    global _process_sets_fn
    _process_sets_fn = fn


def _process_sets_after_reset(n):
    """(the process_sets for init, [(set, the registered set it now equals or None
    for the global set)]): a set whose ranks are now the whole world, or another
    set's, is bound to that one rather than registered twice."""
    trim = _process_sets_fn is None
    given = _process_sets_fn(n) if not trim else basics._last_process_sets
    if given is None or given == "dynamic":
        return given, []
    kept, same = [], []
    for ps in given:
        if trim:
            ps._given = [r for r in ps._given if r < n]
        ps.process_set_id = None
        if not ps._given:
            continue
        twin = [k for k in kept if sorted(k._given) == sorted(ps._given)]
        if sorted(ps._given) == list(range(n)) or twin:
            same.append((ps, twin[0] if twin else None))
        else:
            kept.append(ps)
    return kept, same


def reset_world(after_shutdown=None):
    """Leaves the current round and joins the next one the driver forms;
    after_shutdown() lets the frontend drop what it had in flight."""
    basics.shutdown()
    if after_shutdown:
        after_shutdown()
    _, n = _core.elastic_join_next_round()  # the next init joins this round
    sets, same = _process_sets_after_reset(n)
    basics.init(process_sets=sets)
    basics._last_process_sets = sets if not same else list(sets) + [ps for ps, _ in same]
    for ps, twin in same:
        ps._bind(twin.process_set_id if twin is not None else 0)
        basics._initialized_sets.append(ps)  # unbound by the next shutdown, as the others


def _say(what):
    sys.stderr.write(f"chorus.elastic: rank {basics.rank()}: {what}\n")
    sys.stderr.flush()


def run_fn(func, reset, failures):
    """Horovod's elastic loop around func(state, ...): before func runs (and after
    every reset) the state is synchronized from rank 0; an exception of a type in
    failures (a peer's failure) restores the last commit; HostsUpdatedInterrupt
    keeps the state as committed. Either way reset() re-forms the job and func
    runs again."""
    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        skip_sync = False
        while True:
            try:
                if not skip_sync:
                    state.sync()
                return func(state, *args, **kwargs)
            except failures as e:
                _say(f"{e}; rolling back to the last commit")
                state.restore()
                skip_sync = False
            except HostsUpdatedInterrupt as e:
                _say(f"{e}; re-forming the job")
                # (A state whose partitions move with the world, as a ZeRO engine's, syncs every time.)
                skip_sync = e.skip_sync and not getattr(state, "sync_after_every_reset", False)
            reset()
            state.on_reset()
    return wrapper
