"""deepspeed.runtime.engine"""
from chorus.deepspeed.engine import DeepSpeedEngine  # noqa: F401
