"""deepspeed.ops.adam: DeepSpeedCPUAdam and FusedAdam."""
from chorus.deepspeed.ops.adam.cpu_adam import DeepSpeedCPUAdam  # noqa: F401
from chorus.deepspeed.ops.adam.fused_adam import FusedAdam  # noqa: F401
