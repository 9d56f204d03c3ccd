"""The TensorFlow suite: run by the venv's Python that chorus's TensorFlow ops
were built against (scripts/tf-venv.sh); workers run under chorusrun with it."""
import importlib.util
import os
import sys

_spec = importlib.util.spec_from_file_location(
    "chorus_python_conftest", os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                           "python", "conftest.py"))
_common = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_common)

BUILD = _common.BUILD
ok = _common.ok
WORKERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "workers")


class Ranks(_common.Ranks):
    def __call__(self, n, script, *args, env=None, **kw):
        path = script if os.path.isabs(script) else os.path.join(WORKERS, script)
        full = {"TF_CPP_MIN_LOG_LEVEL": "2", "TF_ENABLE_ONEDNN_OPTS": "0"}
        full.update(env or {})
        return super().__call__(n, path, *args, env=full, **kw)


import pytest  # noqa: E402


@pytest.fixture
def ranks():
    return Ranks()


__all__ = ["ok", "BUILD", "WORKERS", "sys"]
