"""Ranks with uneven data (the last one batch more, as dataset.shard after batching
gives it): fit completes through the end-of-fit join, and afterwards every rank's
variables equal those of the last rank to join."""
import keras
import numpy as np

import chorus.tensorflow.keras as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()
batches = 3 + (1 if r == n - 1 else 0)
rng = np.random.default_rng(r)
X = rng.normal(size=(8 * batches, 4)).astype(np.float32)
Y = (X.sum(1) > 0).astype(np.int64)
keras.utils.set_random_seed(0)
m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(6, activation="tanh"), keras.layers.Dense(2)])
m.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9)),
          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
m.fit(X, Y, batch_size=8, epochs=1, shuffle=False, verbose=0,
      callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
values = [np.asarray(v.numpy()) for v in list(m.variables) + list(m.optimizer.variables)]
mine = np.concatenate([a.ravel().astype(np.float64) for a in values if np.issubdtype(a.dtype, np.floating)])
everyone = hvd.allgather_object(mine)
for k in range(n):
    assert np.array_equal(everyone[k], everyone[n - 1]), f"rank {k}'s variables differ from the last rank's"
print(f"tf uneven ok rank {r}", flush=True)
