"""The command a chorus ZeRO checkpoint folder's zero_to_fp32.py ran before the
module moved to DeepSpeed's path (deepspeed.utils.zero_to_fp32); kept for those files."""
from chorus.deepspeed.utils.zero_to_fp32 import main  # noqa: F401
