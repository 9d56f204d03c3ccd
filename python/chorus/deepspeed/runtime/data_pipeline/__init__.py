"""deepspeed.runtime.data_pipeline: data efficiency (curriculum learning, random layerwise token dropping)."""
