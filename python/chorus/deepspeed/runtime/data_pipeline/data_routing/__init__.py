"""deepspeed.runtime.data_pipeline.data_routing: random layerwise token dropping (random-LTD)."""
from chorus.deepspeed.runtime.data_pipeline.data_routing.basic_layer import RandomLayerTokenDrop  # noqa: F401
from chorus.deepspeed.runtime.data_pipeline.data_routing.helper import (convert_to_random_ltd,  # noqa: F401
                                                                        remove_random_ltd_state_dict,
                                                                        save_without_random_ltd)
from chorus.deepspeed.runtime.data_pipeline.data_routing.scheduler import RandomLTDScheduler  # noqa: F401
