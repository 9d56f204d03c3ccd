"""Helpers that Horovod exports from horovod.common.util and its frameworks re-export."""
import contextlib
import importlib
import os


def check_extension(ext_name, ext_env_var, pkg_path, *args):
    """Raises ImportError when chorus's compiled core cannot be loaded (Horovod checks
    that its extension library was built; chorus has one core for every frontend)."""
    try:
        importlib.import_module("chorus._core")
    except ImportError as e:
        raise ImportError(f"{ext_name}: chorus's compiled core (chorus._core) is missing or does not load "
                          f"({e}); rebuild chorus with scripts/build.sh") from e


def gpu_available(ext_base_name, verbose=False):
    """Whether the framework sees a GPU."""
    if ext_base_name == "torch":
        import torch
        return torch.cuda.is_available()
    if ext_base_name == "tensorflow":
        try:
            import tensorflow as tf
        except ImportError:
            return False
        return bool(tf.config.list_physical_devices("GPU"))
    return False


def split_list(items, n):
    """Splits items into n contiguous parts whose lengths differ by at most one."""
    if n < 1:
        raise ValueError(f"split_list needs n >= 1, got {n}")
    per, extra = divmod(len(items), n)
    bounds = [k * per + min(k, extra) for k in range(n + 1)]
    return [items[bounds[k]:bounds[k + 1]] for k in range(n)]


def is_version_greater_equal_than(ver, target):
    """Whether version string ver is at least target (both "x.y.z")."""
    from packaging.version import Version
    return Version(str(ver)) >= Version(str(target))


def _cache(f):
    """Remembers f's result per arguments (Horovod's, for its checks of what was built)."""
    results = {}

    def wrapper(*args, **kwargs):
        key = (args, frozenset(kwargs.items()))
        if key not in results:
            results[key] = f(*args, **kwargs)
        return results[key]

    return wrapper


@_cache
def extension_available(ext_base_name, verbose=False):
    """Whether chorus serves that framework here: its frontend and the framework both import
    (chorus has no MXNet frontend)."""
    frontend = {"torch": "chorus.torch", "tensorflow": "chorus.tensorflow"}.get(ext_base_name)
    if frontend is None:
        return False
    try:
        importlib.import_module(ext_base_name)
        importlib.import_module(frontend)
    except ImportError:
        return False
    return True


def mpi_built(verbose=False):
    from chorus.common.basics import mpi_built as built
    return built(verbose)


def gloo_built(verbose=False):
    from chorus.common.basics import gloo_built as built
    return built(verbose)


def nccl_built(verbose=False):
    from chorus.common.basics import nccl_built as built
    return built(verbose)


def ddl_built(verbose=False):
    return False


def ccl_built(verbose=False):
    return False


@contextlib.contextmanager
def env(**kwargs):
    """Sets the given environment variables (None: left alone) for the block, then restores them."""
    given = {k: v for k, v in kwargs.items() if v is not None}
    saved = {k: os.environ.get(k) for k in given}
    os.environ.update(given)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def num_rank_is_power_2(num_rank):
    """Whether num_rank is a power of 2 (what Adasum's recursive halving needs)."""
    return num_rank != 0 and (num_rank & (num_rank - 1)) == 0


def is_iterable(x):
    try:
        iter(x)
    except TypeError:
        return False
    return True
