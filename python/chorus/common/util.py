"""Helpers that Horovod exports from horovod.common.util and its frameworks re-export."""
import importlib


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
