"""deepspeed.runtime.zero"""
from chorus.deepspeed.runtime.zero import partition_parameters  # noqa: F401
from chorus.deepspeed.runtime.zero.partition_parameters import (  # noqa: F401
    GatheredParameters, Init, ZeroParamStatus, register_external_parameter, unregister_external_parameter)
