"""run(): the elastic training loop around the user's function."""
import functools
import sys

from chorus import _core
from chorus.torch import basics
from chorus.torch.elastic.state import HostsUpdatedInterrupt
from chorus.torch.mpi_ops import HorovodInternalError
from chorus.torch.optimizer_common import reset_all_in_flight

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
    if _process_sets_fn is not None:
        return _process_sets_fn(n)
    given = basics._last_process_sets
    if given is None or given == "dynamic":
        return given
    kept = []
    for ps in given:
        ps._given = [r for r in ps._given if r < n]
        ps.process_set_id = None
        if ps._given:
            kept.append(ps)
    return kept


def _say(what):
    sys.stderr.write(f"chorus.torch.elastic: rank {basics.rank()}: {what}\n")
    sys.stderr.flush()


def reset():
    """Leaves the current round and joins the next one the driver forms."""
    basics.shutdown()
    reset_all_in_flight()
    _, n = _core.elastic_join_next_round()  # the next init joins this round
    basics.init(process_sets=_process_sets_after_reset(n))


def run(func):
    """Decorates func(state, ...): the elastic loop as Horovod's. Before func runs
    (and after every reset) the state is synchronized from rank 0; a peer's failure
    (HorovodInternalError) restores the last commit; HostsUpdatedInterrupt keeps the
    state as committed. Either way the job re-forms and func runs again."""
    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        skip_sync = False
        while True:
            try:
                if not skip_sync:
                    state.sync()
                return func(state, *args, **kwargs)
            except HorovodInternalError as e:
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
