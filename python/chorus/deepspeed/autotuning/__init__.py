"""deepspeed.autotuning: the autotuner chorusrun --autotuning runs."""
from chorus.deepspeed.autotuning.autotuner import Autotuner  # noqa: F401
