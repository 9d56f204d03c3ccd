"""deepspeed.runtime.base_optimizer: the type of the optimizer deepspeed.initialize returns."""
from chorus.deepspeed.optimizer import ZeroOptimizer as DeepSpeedOptimizer  # noqa: F401
from chorus.deepspeed.optimizer import ZeroOptimizer as ZeROOptimizer  # noqa: F401
