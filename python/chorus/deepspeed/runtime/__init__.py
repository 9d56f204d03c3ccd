"""deepspeed.runtime"""
from chorus.deepspeed.runtime import lr_schedules, zero  # noqa: F401
