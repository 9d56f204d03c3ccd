"""deepspeed.checkpoint"""
from chorus.deepspeed.checkpoint import utils  # noqa: F401
