"""TensorFlowState and TensorFlowKerasState: after sync() every rank holds rank 0's
values, and a later restore() brings back those synced values (not a rank's own
from before the sync); collectives go on afterwards."""
import keras
import tensorflow as tf

import chorus.tensorflow as hvd
import chorus.tensorflow.keras as hvdk

hvd.init()
r = hvd.rank()
v = tf.Variable([float(r), float(r) + 1])
state = hvd.elastic.TensorFlowState(variables=[v], epoch=r)
state.sync()
assert v.numpy().tolist() == [0.0, 1.0] and state.epoch == 0, (v.numpy(), state.epoch)
v.assign([9.0, 9.0])
state.restore()
assert v.numpy().tolist() == [0.0, 1.0], v.numpy()

keras.utils.set_random_seed(r)  # every rank a different model
model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
kstate = hvdk.elastic.KerasState(model, batch=0, epoch=0) if hasattr(hvdk.elastic, "KerasState") else \
    hvd.elastic.TensorFlowKerasState(model, batch=0, epoch=0)
kstate.sync()
synced = [w.copy() for w in model.get_weights()]
everyone = hvd.allgather_object(synced[0].tolist())
assert all(e == everyone[0] for e in everyone)
model.set_weights([w + 1 for w in model.get_weights()])
kstate.restore()
assert all((a == b).all() for a, b in zip(model.get_weights(), synced))
total = hvd.allreduce(tf.constant([1.0]), op=hvd.Sum).numpy()[0]
assert total == hvd.size()
print(f"tf state sync ok rank {r}", flush=True)
