"""deepspeed.runtime.activation_checkpointing"""
from chorus.deepspeed.runtime.activation_checkpointing import checkpointing  # noqa: F401
