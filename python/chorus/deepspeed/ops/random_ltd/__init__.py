"""deepspeed.ops.random_ltd: the token sampling, gathering and scattering of random-LTD,
in torch ops (DeepSpeed's are CUDA kernels)."""
from chorus.deepspeed.ops.random_ltd.dropping_utils import (GatherTokens, ScatterTokens,  # noqa: F401
                                                             bert_sample_tokens, gpt_sample_tokens)
