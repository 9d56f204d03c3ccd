"""hvd.elastic.run with TensorFlowKerasState: the job grows from 2 to 3 workers
mid-epoch (discovery lists a third slot); the newcomer receives the committed
model and optimizer, the epoch and batch go on from the commit, and every
worker ends with the same weights."""
import os
import sys
import time

import keras
import numpy as np
import tensorflow as tf

import chorus.tensorflow as hvd

listing = sys.argv[1]
hvd.init()
keras.utils.set_random_seed(os.getpid())  # different weights everywhere until the state is synced
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)])
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9)), loss="mse")
state = hvd.elastic.TensorFlowKerasState(model, epoch=0, batch=0, grown=False)
EPOCHS, STEPS = 3, 6

# restore() brings back what the last save (commit) kept, as a peer's failure does. Local
# only: a worker that joins later runs this too, while the others are in their sync.
state.save()
every = list(model.variables) + list(model.optimizer.variables)
saved = [v.numpy().copy() for v in every]
for v in every:
    v.assign(v + tf.ones_like(v))
state.epoch = 7
state.restore()
assert state.epoch == 0
assert all(np.array_equal(v.numpy(), s) for v, s in zip(every, saved))


def batch(epoch, step, rank, size):
    g = np.random.default_rng(1000 * epoch + 10 * step + rank)
    x = g.normal(size=(8, 4)).astype(np.float32)
    return x, x.sum(1, keepdims=True) * 0.5


def on_reset():
    print(f"rank {hvd.rank()}: reset to {hvd.size()} workers at epoch {state.epoch} batch {state.batch}", flush=True)


state.register_reset_callbacks([on_reset])


@hvd.elastic.run
def train(state):
    while state.epoch < EPOCHS:
        while state.batch < STEPS:
            x, y = batch(state.epoch, state.batch, hvd.rank(), hvd.size())
            model.train_on_batch(x, y)
            state.batch += 1
            if hvd.rank() == 0 and state.epoch == 1 and state.batch == 2 and not state.grown:
                state.grown = True
                with open(listing + ".tmp", "w") as f:
                    f.write("localhost:3\n")
                os.replace(listing + ".tmp", listing)
            time.sleep(0.2)  # time for the driver to see the new slot
            state.commit()
        state.epoch += 1
        state.batch = 0
        state.commit()


train(state)
weights = [v.numpy() for v in model.trainable_variables]
everyone = hvd.allgather_object(weights)
assert all(np.array_equal(a, b) for w in everyone for a, b in zip(w, weights))
print(f"rank {hvd.rank()}: elastic keras done on {hvd.size()} workers at epoch {state.epoch}", flush=True)
