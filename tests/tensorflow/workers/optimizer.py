"""DistributedGradientTape and the Keras DistributedOptimizer give the weights
of one process training on the global batch (computed here, without chorus)."""
import os

import keras
import numpy as np
import tensorflow as tf

import chorus.tensorflow as hvd
import chorus.tensorflow.keras as hvdk

hvd.init()
r, n = hvd.rank(), hvd.size()
PER = 4  # rows per rank per step
rng = np.random.default_rng(0)
X = rng.normal(size=(6 * PER * n, 5)).astype(np.float32)
Y = rng.integers(0, 3, size=6 * PER * n)


def model():
    keras.utils.set_random_seed(42)  # the same initial weights everywhere
    return keras.Sequential([keras.Input((5,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(3)])


loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def local_rows(step):
    lo = step * PER * n + r * PER
    return X[lo:lo + PER], Y[lo:lo + PER]


def global_rows(step):
    lo = step * PER * n
    return X[lo:lo + PER * n], Y[lo:lo + PER * n]


def close(a, b, what, tol=1e-5):
    for x, y in zip(a, b):
        assert np.allclose(np.asarray(x), np.asarray(y), atol=tol), (what, x, y)


def train_tape(distributed, make_opt, steps=4, graph=False):
    m, opt = model(), make_opt()

    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, m(x, training=True))
        if distributed:
            tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, m.trainable_variables)
        opt.apply_gradients(zip(grads, m.trainable_variables))
        return loss

    fn = tf.function(step) if graph else step
    for s in range(steps):
        fn(*(local_rows(s) if distributed else global_rows(s)))
    return [v.numpy() for v in m.trainable_variables]


for make_opt in (lambda: keras.optimizers.SGD(0.1), lambda: keras.optimizers.Adam(0.01)):
    ref = train_tape(False, make_opt)
    for graph in (False, True):
        close(train_tape(True, make_opt, graph=graph), ref, f"tape graph={graph}")

# The Keras optimizer in model.fit, each rank on its shard.
for make_opt in (lambda: keras.optimizers.SGD(0.1, momentum=0.9), lambda: keras.optimizers.Adam(0.01)):
    ref_model = model()
    ref_model.compile(optimizer=make_opt(), loss=loss_fn)
    ref_model.fit(X, Y, batch_size=PER * n, epochs=1, shuffle=False, verbose=0)
    m = model()
    m.compile(optimizer=hvd.DistributedOptimizer(make_opt()), loss=loss_fn)
    assert hvdk.is_distributed(m.optimizer)
    xs = np.concatenate([local_rows(s)[0] for s in range(6)])
    ys = np.concatenate([local_rows(s)[1] for s in range(6)])
    m.fit(xs, ys, batch_size=PER, epochs=1, shuffle=False, verbose=0)
    close([v.numpy() for v in m.trainable_variables], [v.numpy() for v in ref_model.trainable_variables], "fit")

# backward_passes_per_step=2 with averaged aggregation: one update per two local
# batches, as one process taking both global batches at once.
ref_model = model()
ref_model.compile(optimizer=keras.optimizers.SGD(0.1), loss=loss_fn)
ref_model.fit(X, Y, batch_size=2 * PER * n, epochs=1, shuffle=False, verbose=0)
m = model()
m.compile(optimizer=hvdk.DistributedOptimizer(keras.optimizers.SGD(0.1), backward_passes_per_step=2,
                                              average_aggregated_gradients=True), loss=loss_fn)
m.fit(xs, ys, batch_size=PER, epochs=1, shuffle=False, verbose=0)
close([v.numpy() for v in m.trainable_variables], [v.numpy() for v in ref_model.trainable_variables], "bpps")

# groups and num_groups reduce the same values.
for kw in ({"num_groups": 2}, {"groups": 1}):
    m = model()
    m.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), **kw), loss=loss_fn)
    m.fit(xs, ys, batch_size=PER, epochs=1, shuffle=False, verbose=0)
    ref_model = model()
    ref_model.compile(optimizer=keras.optimizers.SGD(0.1), loss=loss_fn)
    ref_model.fit(X, Y, batch_size=PER * n, epochs=1, shuffle=False, verbose=0)
    close([v.numpy() for v in m.trainable_variables], [v.numpy() for v in ref_model.trainable_variables], kw)

# Saved with the distributed optimizer; load_model gives it back distributed.
path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"chorus_tf_model_{os.getppid()}_{r}.keras")
m.save(path)
loaded = hvdk.load_model(path)
assert hvdk.is_distributed(loaded.optimizer), type(loaded.optimizer).__mro__
close([v.numpy() for v in loaded.trainable_variables], [v.numpy() for v in m.trainable_variables], "load")
os.remove(path)

# The tf.compat.v1 optimizer path.
m = model()
plain = tf.compat.v1.train.GradientDescentOptimizer(0.1)
opt = hvd.DistributedOptimizer(plain)
assert opt._optimizer is plain  # where Horovod's wrapper keeps the wrapped optimizer
for s in range(3):
    x, y = local_rows(s)
    opt.minimize(lambda: loss_fn(y, m(x)), var_list=[v.value for v in m.trainable_variables])
ref = model()
ref_opt = tf.compat.v1.train.GradientDescentOptimizer(0.1)
for s in range(3):
    x, y = global_rows(s)
    ref_opt.minimize(lambda: loss_fn(y, ref(x)), var_list=[v.value for v in ref.trainable_variables])
close([v.numpy() for v in m.trainable_variables], [v.numpy() for v in ref.trainable_variables], "v1")

hvd.shutdown()
print(f"rank {r}: tf optimizer ok")
