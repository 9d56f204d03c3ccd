"""Elastic training with horovod.tensorflow.elastic's names: run, State,
ObjectState, TensorFlowState, TensorFlowKerasState, and the Keras callbacks
that commit and count (CommitStateCallback, UpdateBatchStateCallback,
UpdateEpochStateCallback)."""
import functools

from chorus.tensorflow._keras import keras, optimizer_variables
import tensorflow as tf

from chorus import _core
from chorus.common.elastic import HostsUpdatedInterrupt, ObjectState, State, reset_world, run_fn  # noqa: F401
from chorus.tensorflow.functions import broadcast_object, broadcast_variables


def _is_peer_failure(e):
    """A failed chorus op surfaces as tf.errors.UnknownError (a lost peer,
    timeout, stall or shutdown; see src/tensorflow/tf_kernels.cc)."""
    return isinstance(e, tf.errors.UnknownError) or isinstance(e, _core.HorovodInternalError)


class _PeerFailure(Exception):
    pass


def run(func):
    """Decorates func(state, ...) with Horovod's elastic loop: a peer's failure
    rolls back to the last commit, a change of hosts keeps it; the job re-forms
    and func runs again."""
    @functools.wraps(func)
    def translated(state, *args, **kwargs):
        try:
            return func(state, *args, **kwargs)
        except (tf.errors.OpError, _core.ChorusError) as e:
            if _is_peer_failure(e):
                raise _PeerFailure(str(e)) from e
            raise
    return run_fn(translated, reset_world, _PeerFailure)


class _VariablesState(ObjectState):
    """Variables (self._variables()) saved at commit(), restored after a failure and
    broadcast from rank 0 at every sync; plain values as keyword arguments."""

    def __init__(self, **kwargs):
        self._saved_values = self._values()
        super().__init__(bcast_object=broadcast_object, **kwargs)

    def _variables(self):
        raise NotImplementedError

    def _values(self):
        return [tf.identity(v).numpy() for v in self._variables()]

    def save(self):
        self._saved_values = self._values()
        super().save()

    def restore(self):
        variables = self._variables()
        if len(variables) == len(self._saved_values):
            for v, value in zip(variables, self._saved_values):
                v.assign(value)
        super().restore()

    def sync(self):
        broadcast_variables(self._variables(), root_rank=0)
        # What was synced is what a later restore() brings back (rank 0's, on every rank).
        self._saved_values = self._values()
        super().sync()


class TensorFlowState(_VariablesState):
    """tf.Variables (and plain values as keyword arguments) saved at commit()."""

    def __init__(self, variables=None, session=None, **kwargs):
        self.variables = list(variables or [])
        super().__init__(**kwargs)

    def _variables(self):
        return self.variables


class TensorFlowKerasState(_VariablesState):
    """A Keras model and its optimizer (and plain values: epoch=..., batch=...)."""

    def __init__(self, model, optimizer=None, backend=None, **kwargs):
        self.model = model
        self.optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)
        super().__init__(**kwargs)

    def _variables(self):
        if self.optimizer is not None and getattr(self.optimizer, "built", True) is False:
            # A worker that joins has not stepped yet: its optimizer's slots must
            # exist to receive the committed ones.
            self.optimizer.build(self.model.trainable_variables)
        if self.optimizer is not None and hasattr(self.optimizer, "_create_all_weights"):
            self.optimizer._create_all_weights(self.model.trainable_variables)  # Keras 2's legacy slots
        opt = optimizer_variables(self.optimizer)
        return list(self.model.variables) + opt


class CommitStateCallback(keras.callbacks.Callback):
    """Commits the state every batches_per_commit batches and at each epoch's end."""

    def __init__(self, state, batches_per_commit=1):
        super().__init__()
        self.state = state
        self.batches_per_commit = batches_per_commit
        self._remaining = batches_per_commit

    def on_train_batch_end(self, batch, logs=None):
        self._remaining -= 1
        if self._remaining == 0:
            self.state.commit()
            self._remaining = self.batches_per_commit

    def on_epoch_end(self, epoch, logs=None):
        self.state.commit()


class UpdateBatchStateCallback(keras.callbacks.Callback):
    """Keeps state.batch current (resumes an epoch where it was cut)."""

    def __init__(self, state):
        super().__init__()
        self.state = state

    def on_train_batch_end(self, batch, logs=None):
        self.state.batch = batch + 1

    def on_epoch_end(self, epoch, logs=None):
        self.state.batch = 0


class UpdateEpochStateCallback(keras.callbacks.Callback):
    """Keeps state.epoch current."""

    def __init__(self, state):
        super().__init__()
        self.state = state

    def on_epoch_end(self, epoch, logs=None):
        self.state.epoch = epoch + 1


KerasState = TensorFlowKerasState
