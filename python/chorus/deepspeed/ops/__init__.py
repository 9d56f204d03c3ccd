"""deepspeed.ops"""
from chorus.deepspeed.ops import adam  # noqa: F401
