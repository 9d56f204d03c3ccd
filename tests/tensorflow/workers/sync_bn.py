"""SyncBatchNormalization against plain BatchNormalization over the whole batch
(every rank's rows, of different counts): the outputs, the moving statistics and
the input gradients of this rank's rows agree. Keras 3, or Keras 2 under
TF_USE_LEGACY_KERAS=1."""
import numpy as np
import tensorflow as tf

import chorus.tensorflow as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()
keras = tf.keras
rows = [3 + k for k in range(n)]
start = sum(rows[:r])
rng = np.random.default_rng(7)
full = tf.constant(rng.normal(2.0, 3.0, size=(sum(rows), 5)).astype(np.float32))
weights = tf.constant(rng.normal(size=(sum(rows), 5)).astype(np.float32))
mine, my_weights = full[start:start + rows[r]], weights[start:start + rows[r]]

plain = keras.layers.BatchNormalization(momentum=0.5)
synced = hvd.SyncBatchNormalization(momentum=0.5)
with tf.GradientTape() as tape:
    tape.watch(full)
    want = plain(full, training=True)
    loss = tf.reduce_sum(want * weights)
want_grad = tape.gradient(loss, full)[start:start + rows[r]]
with tf.GradientTape() as tape:
    tape.watch(mine)
    got = synced(mine, training=True)
    my_loss = tf.reduce_sum(got * my_weights)  # the ranks' losses add up to the whole batch's
got_grad = tape.gradient(my_loss, mine)

np.testing.assert_allclose(got.numpy(), want.numpy()[start:start + rows[r]], rtol=1e-4, atol=1e-4)
np.testing.assert_allclose(synced.moving_mean.numpy(), plain.moving_mean.numpy(), rtol=1e-5, atol=1e-5)
np.testing.assert_allclose(synced.moving_variance.numpy(), plain.moving_variance.numpy(), rtol=1e-4, atol=1e-4)
np.testing.assert_allclose(got_grad.numpy(), want_grad.numpy(), rtol=1e-3, atol=1e-4)
# A mean far from zero next to the spread: the variance must not cancel away in float32.
shifted = full * 0.1 + 1e3  # E[x^2] is 1e6, where float32's step is 0.06; the variance is 0.09
reference = np.var(shifted.numpy().astype(np.float64), axis=0)
far = hvd.SyncBatchNormalization(momentum=0.0)
got_far = far(shifted[start:start + rows[r]], training=True)
np.testing.assert_allclose(far.moving_variance.numpy(), reference, rtol=1e-2)
want_far = (shifted.numpy().astype(np.float64) - shifted.numpy().astype(np.float64).mean(0)) / np.sqrt(reference + 1e-3)
np.testing.assert_allclose(got_far.numpy(), want_far[start:start + rows[r]], rtol=1e-3, atol=1e-3)
local = keras.layers.BatchNormalization(momentum=0.5)(mine, training=True)
assert not np.allclose(local.numpy(), got.numpy(), atol=1e-3)  # the rank's own statistics differ
try:
    hvd.SyncBatchNormalization(fused=True)
    raise SystemExit("fused=True accepted")
except ValueError:
    pass
print(f"sync bn ok rank {r} keras {keras.__name__}", flush=True)
