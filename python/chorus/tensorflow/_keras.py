"""The Keras that tf.keras is in this process: Keras 3, or Keras 2 (the tf_keras
package) when TF_USE_LEGACY_KERAS=1. chorus.tensorflow.keras's callbacks, model
loading and mixed-precision wrapping follow it, as the program's own tf.keras does."""
import tensorflow as tf

keras = tf.keras
KERAS2 = keras.__name__.split(".")[0] == "tf_keras"


def optimizer_variables(optimizer):
    """An optimizer's variables (a property in Keras 3 and Keras 2.11+, a method on
    Keras 2's legacy optimizers)."""
    if optimizer is None:
        return []
    v = optimizer.variables
    return list(v() if callable(v) else v)


def loss_scale_optimizer_type():
    return keras.mixed_precision.LossScaleOptimizer if KERAS2 else keras.optimizers.LossScaleOptimizer
