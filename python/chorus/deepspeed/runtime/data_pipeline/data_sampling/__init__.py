"""deepspeed.runtime.data_pipeline.data_sampling: curriculum learning's analyzer, index files and sampler."""
from chorus.deepspeed.runtime.data_pipeline.data_sampling.data_analyzer import DataAnalyzer  # noqa: F401
from chorus.deepspeed.runtime.data_pipeline.data_sampling.data_sampler import DeepSpeedDataSampler  # noqa: F401
