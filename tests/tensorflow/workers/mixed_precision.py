"""Keras mixed precision under the distributed optimizer: mixed_float16 with
Keras's loss scaler (the scaled gradients are reduced before the scaler checks
them, so an overflow on one rank makes every rank skip the step together) and
mixed_bfloat16."""
import keras
import numpy as np

import chorus.tensorflow.keras as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()
rng = np.random.default_rng(r)
X = rng.normal(size=(64, 6)).astype(np.float32)
Y = (X[:, 0] > 0).astype(np.int64)


def build():
    keras.utils.set_random_seed(3)
    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(16, activation="relu"),
                             keras.layers.Dense(2, dtype="float32")])


def weights(m):
    return [v.numpy().astype(np.float32) for v in m.trainable_variables]


def same_everywhere(ws, what):
    for other in hvd.allgather_object(ws):
        assert all(np.array_equal(a, b) for a, b in zip(other, ws)), what


loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
for policy in ("mixed_float16", "mixed_bfloat16"):
    keras.mixed_precision.set_global_policy(policy)
    m = build()
    opt = hvd.DistributedOptimizer(keras.optimizers.Adam(0.01))
    assert hvd.is_distributed(opt)
    assert isinstance(opt, keras.optimizers.LossScaleOptimizer) == (policy == "mixed_float16")
    m.compile(optimizer=opt, loss=loss)
    assert m.optimizer is opt  # compile did not wrap it again
    assert m.layers[0].compute_dtype == ("float16" if policy == "mixed_float16" else "bfloat16")
    first = m.evaluate(X, Y, verbose=0)
    m.fit(X, Y, batch_size=16, epochs=5, shuffle=False, verbose=0)
    assert m.evaluate(X, Y, verbose=0) < first
    same_everywhere(weights(m), policy)

    if policy == "mixed_float16":
        # Rank 1's batch overflows in float16: every rank skips that step and halves its scale.
        scale = float(opt.dynamic_scale.numpy())
        before = weights(m)
        bad = X[:16].copy()
        if r == 1 or n == 1:
            bad[:] = 6e4  # float16 overflows in the forward or backward pass
        m.fit(bad, Y[:16], batch_size=16, epochs=1, shuffle=False, verbose=0)
        assert float(opt.dynamic_scale.numpy()) == scale / 2, (opt.dynamic_scale.numpy(), scale)
        assert all(np.array_equal(a, b) for a, b in zip(weights(m), before))
        same_everywhere(weights(m), "after overflow")
keras.mixed_precision.set_global_policy("float32")
hvd.shutdown()
print(f"rank {r}: tf mixed precision ok")
