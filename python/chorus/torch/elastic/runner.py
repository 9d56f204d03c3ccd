"""run(): the elastic training loop around the user's function."""
from chorus.common.elastic import reset_world, run_fn, set_process_sets  # noqa: F401 (re-exported)
from chorus.torch.mpi_ops import HorovodInternalError
from chorus.torch.optimizer_common import reset_all_in_flight


def reset():
    """Leaves the current round and joins the next one the driver forms."""
    reset_world(after_shutdown=reset_all_in_flight)


def run(func):
    """Decorates func(state, ...): the elastic loop as Horovod's (chorus.common.elastic.run_fn),
    where a peer's failure is a HorovodInternalError."""
    return run_fn(func, reset, HorovodInternalError)
