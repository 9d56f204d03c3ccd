"""deepspeed.ops"""
from chorus.deepspeed.ops import adagrad, adam, lamb, lion  # noqa: F401
