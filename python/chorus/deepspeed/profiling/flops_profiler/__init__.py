"""deepspeed.profiling.flops_profiler"""
from chorus.deepspeed.profiling.flops_profiler.profiler import (FlopsProfiler, duration_to_string,  # noqa: F401
                                                                 flops_to_string, get_model_profile,
                                                                 macs_to_string, number_to_string,
                                                                 params_to_string)
