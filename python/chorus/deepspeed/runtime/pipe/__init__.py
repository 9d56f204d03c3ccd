"""deepspeed.runtime.pipe: the pipeline engine, module, schedule and topology."""
