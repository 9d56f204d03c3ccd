"""The Keras callbacks' effects: broadcast at the start, averaged metrics, the
warm-up and schedule learning rates, the best-model checkpoint on rank 0."""
import os
import sys

import keras
import numpy as np

import chorus.tensorflow.keras as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()
out_dir = sys.argv[1]
rng = np.random.default_rng(r)  # each rank its own data
X = rng.normal(size=(32, 4)).astype(np.float32)
Y = (X.sum(1) > 0).astype(np.int64)
STEPS = 4  # 32 rows / batches of 8


def model(seed):
    keras.utils.set_random_seed(seed)
    m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(6, activation="tanh"), keras.layers.Dense(2)])
    m.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return m


class Record(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.start, self.lrs, self.epoch_logs = None, [], []

    def on_train_begin(self, logs=None):
        self.start = [v.numpy().copy() for v in self.model.trainable_variables]

    def on_train_batch_begin(self, batch, logs=None):
        self.lrs.append(float(self.model.optimizer.learning_rate.numpy()))

    def on_epoch_end(self, epoch, logs=None):
        self.epoch_logs.append(dict(logs))


class RankMetric(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        logs["rank_metric"] = float(r)


# Broadcast at the start: every rank begins from rank 0's weights and ends equal.
m = model(seed=100 + r)
rank0_start = hvd.broadcast_object([v.numpy() for v in m.trainable_variables], root_rank=0)
rec = Record()
local_loss = RankMetric()
m.fit(X, Y, batch_size=8, epochs=2, shuffle=False, verbose=0,
      callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), rec])
assert all(np.array_equal(a, b) for a, b in zip(rec.start, rank0_start))
final = [v.numpy() for v in m.trainable_variables]
for other in hvd.allgather_object(final):
    assert all(np.allclose(a, b) for a, b in zip(other, final))

# Metric averaging: the logs after MetricAverageCallback hold the ranks' mean.
before, after = Record(), Record()
m.fit(X, Y, batch_size=8, epochs=1, shuffle=False, verbose=0,
      callbacks=[RankMetric(), before, hvd.callbacks.MetricAverageCallback(), after])
assert before.epoch_logs[0]["rank_metric"] == float(r)
assert np.isclose(after.epoch_logs[0]["rank_metric"], (n - 1) / 2)
losses = hvd.allgather_object(before.epoch_logs[0]["loss"])
assert np.isclose(after.epoch_logs[0]["loss"], np.mean(losses)), (after.epoch_logs, losses)

# Warm-up from lr/size to lr over two epochs, batch by batch, then left there.
m = model(seed=1)
rec = Record()
m.fit(X, Y, batch_size=8, epochs=3, shuffle=False, verbose=0,
      callbacks=[hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.1, warmup_epochs=2, verbose=1), rec])
want = []
for e in range(3):
    for b in range(STEPS):
        epoch = min(e + b / STEPS + 1 / STEPS, 2.0) if e < 2 else 2.0
        want.append(0.1 / n * (epoch * (n - 1) / 2 + 1))
assert np.allclose(rec.lrs, want, rtol=1e-6), (rec.lrs, want)

# A staircase schedule from epoch 1: lr = 0.1 * 0.5**epoch at each epoch's start.
m = model(seed=1)
rec = Record()
m.fit(X, Y, batch_size=8, epochs=3, shuffle=False, verbose=0,
      callbacks=[hvd.callbacks.LearningRateScheduleCallback(0.1, lambda e: 0.5 ** e, start_epoch=1), rec])
assert np.allclose(rec.lrs, [0.1] * STEPS + [0.05] * STEPS + [0.025] * STEPS), rec.lrs
assert np.isclose(rec.epoch_logs[-1]["lr"], 0.025)

# The best model, written by rank 0 alone.
path = os.path.join(out_dir, f"best_{r}.keras")
m = model(seed=1)
m.fit(X, Y, batch_size=8, epochs=2, shuffle=False, verbose=0, validation_data=(X, Y),
      callbacks=[hvd.callbacks.BestModelCheckpoint(filepath=path, monitor="val_loss")])
assert os.path.exists(path) == (r == 0), (r, os.listdir(out_dir))
if r == 0:
    best = keras.models.load_model(path, compile=False)
    assert len(best.trainable_variables) == 4
hvd.shutdown()
print(f"rank {r}: tf callbacks ok")
