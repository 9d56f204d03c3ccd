"""chorus.tensorflow.keras under Keras 2 (tf_keras, TF_USE_LEGACY_KERAS=1): the
distributed optimizer on the legacy and the 2.11+ optimizers (minimize,
apply_gradients, backward_passes_per_step), the callbacks under model.fit, the
elastic state and load_model. Expected values are worked out here without chorus."""
import os
import sys

import numpy as np
import tensorflow as tf

assert os.environ.get("TF_USE_LEGACY_KERAS") == "1"
keras = tf.keras
assert keras.__name__.startswith("tf_keras"), keras.__name__

import chorus.tensorflow.keras as hvd  # noqa: E402

hvd.init()
r, n = hvd.rank(), hvd.size()
grads = [k + 1.0 for k in range(n)]  # rank k's gradient of x: k + 1
mean = sum(grads) / n

# 1. minimize on the legacy SGD and on 2.11+'s SGD: x -= lr * mean gradient.
for make in (lambda: keras.optimizers.legacy.SGD(learning_rate=0.1), lambda: keras.optimizers.SGD(learning_rate=0.1)):
    opt = hvd.DistributedOptimizer(make())
    assert hvd.is_distributed(opt) and type(opt).__name__ == "SGD"
    x = tf.Variable(1.0)
    opt.minimize(lambda: x * grads[r], [x])
    assert np.isclose(x.numpy(), 1.0 - 0.1 * mean), (type(make()).__module__, x.numpy())
    # ... and apply_gradients given local gradients reduces them once.
    opt.apply_gradients([(tf.constant(grads[r]), x)])
    assert np.isclose(x.numpy(), 1.0 - 0.2 * mean), x.numpy()

# 2. Horovod's legacy entry point, _compute_gradients, returns the averaged gradients.
opt = hvd.DistributedOptimizer(keras.optimizers.legacy.Adam(learning_rate=0.01))
x = tf.Variable(2.0)
(g, _), = opt._compute_gradients(lambda: x * grads[r], var_list=[x])
assert np.isclose(g.numpy(), mean), g.numpy()

# 3. backward_passes_per_step=3 (in a tf.function, as model.fit runs it): the sum of
# three local gradients is averaged over the ranks and applied on every third call;
# every call counts an iteration.
opt = hvd.DistributedOptimizer(keras.optimizers.legacy.SGD(learning_rate=1.0), backward_passes_per_step=3)
x = tf.Variable(0.0)


@tf.function
def step():
    gv = opt._compute_gradients(lambda: x * grads[r], var_list=[x])
    opt.apply_gradients(gv)


for i in range(7):
    step()
    applied = (i + 1) // 3
    assert np.isclose(x.numpy(), -applied * 3 * mean), (i, x.numpy())
    assert int(opt.iterations.numpy()) == i + 1
assert int(opt._agg_helper.counter.numpy()) == 7 % 3
# from_config copies reduce as well.
copy = opt.__class__.from_config(opt.get_config())
assert copy.get_config() == opt.get_config() and hvd.is_distributed(copy)

# 4. model.fit with the callbacks: ranks start from rank 0's weights and end equal.
keras.utils.set_random_seed(r)  # different initial weights on each rank
model = keras.Sequential([keras.layers.Dense(4, activation="relu", input_shape=(3,)), keras.layers.Dense(1)])
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.01)), loss="mse")
rng = np.random.default_rng(r)
X, Y = rng.normal(size=(32, 3)).astype(np.float32), rng.normal(size=(32, 1)).astype(np.float32)
hist = model.fit(X, Y, batch_size=8, epochs=2, verbose=0,
                 callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), hvd.callbacks.MetricAverageCallback()])
flat = np.concatenate([w.ravel() for w in model.get_weights()])
every = hvd.allgather(flat[None, :])
assert np.allclose(every, every[0]), "replicas differ after fit"
losses = hvd.allgather(np.array([hist.history["loss"][-1]]))
assert np.allclose(losses, losses[0]), losses  # MetricAverageCallback: the same averaged loss

# 5. The elastic state restores what was committed.
state = hvd.elastic.KerasState(model, batch=0)
state.commit()
before = [w.copy() for w in model.get_weights()]
model.set_weights([w + 1.0 for w in before])
state.batch = 5
state.restore()
assert all(np.allclose(a, b) for a, b in zip(model.get_weights(), before)) and state.batch == 0

# 6. load_model: the saved optimizer comes back distributed.
path = os.path.join(sys.argv[1], f"model{r}.h5")
model.save(path)
loaded = hvd.load_model(path)
assert hvd.is_distributed(loaded.optimizer), type(loaded.optimizer).__mro__
loaded.fit(X, Y, batch_size=8, epochs=1, verbose=0)
print(f"rank {r}: keras 2 ok")
