"""deepspeed.zero: building and reading ZeRO-3 models (see runtime/zero/partition_parameters.py)."""
from chorus.deepspeed.runtime.zero.partition_parameters import (  # noqa: F401
    GatheredParameters, Init, ZeroParamStatus, register_external_parameter, unregister_external_parameter)
