"""horovod.tensorflow.keras.elastic: run, KerasState and the commit callbacks."""
from chorus.tensorflow.elastic import (CommitStateCallback, HostsUpdatedInterrupt, KerasState, ObjectState,  # noqa
                                       State, TensorFlowKerasState, UpdateBatchStateCallback,
                                       UpdateEpochStateCallback, run)
