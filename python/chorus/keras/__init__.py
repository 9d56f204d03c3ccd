"""``import chorus.keras as hvd`` (horovod.keras): with Keras 3 the same as chorus.tensorflow.keras."""
from chorus.tensorflow.keras import *  # noqa: F401,F403
from chorus.tensorflow.keras import callbacks, elastic, load_model  # noqa: F401
