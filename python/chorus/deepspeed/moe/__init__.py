"""deepspeed.moe: mixture-of-experts layers with expert parallelism over process sets."""
from chorus.deepspeed.moe import experts, layer, sharded_moe, utils  # noqa: F401
