"""deepspeed.runtime.data_pipeline: data efficiency (random layerwise token dropping)."""
