"""Keras callbacks with horovod.tensorflow.keras.callbacks' names and behaviour."""
from chorus.tensorflow._keras import keras, optimizer_variables
import numpy as np
import tensorflow as tf

from chorus.common import basics
from chorus.tensorflow.functions import broadcast_variables, grouped_allreduce
from chorus.tensorflow.mpi_ops import Average, join


def _optimizer_variables(model):
    return optimizer_variables(getattr(model, "optimizer", None))


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """Makes every rank start from root_rank's model and optimizer state: at the
    start of training, and once more after the first batch for optimizer state
    created by that batch.

    At the end of training it also joins (hvd.join): with dataset.shard(), as the
    seed program writes it, ranks can hold one batch more or less than others; a
    rank that ran out stands in for the gradient allreduces the others still run,
    instead of leaving them unmatched (which, under Horovod, fails at the end).
    The steps the last ranks ran alone changed only their replicas: after the
    join every rank takes the variables of the last rank to join."""

    def __init__(self, root_rank, device="", local_variables=None):
        super().__init__()
        self.root_rank = root_rank
        self.device = device
        self.local_variables = {id(v) for v in (local_variables or [])}
        self.broadcast_done = False
        self._count = 0

    def _broadcast(self, root_rank=None):
        variables = [v for v in list(self.model.variables) + _optimizer_variables(self.model)
                     if id(v) not in self.local_variables]
        with tf.device(self.device):
            broadcast_variables(variables, root_rank=self.root_rank if root_rank is None else root_rank)
        self._count = len(variables)

    def on_train_begin(self, logs=None):
        if not self.broadcast_done:
            self._broadcast()

    def on_train_batch_end(self, batch, logs=None):
        if self.broadcast_done:
            return
        if len(self.model.variables) + len(_optimizer_variables(self.model)) != self._count:
            self._broadcast()
        self.broadcast_done = True

    def on_train_end(self, logs=None):
        last = int(join())
        self._broadcast(root_rank=last)  # the replicas agree again


class MetricAverageCallback(keras.callbacks.Callback):
    """Replaces each epoch's metrics in logs by their average over the ranks
    (put it before callbacks that read them, such as ReduceLROnPlateau)."""

    def __init__(self, device=""):
        super().__init__()
        self.device = device

    def on_epoch_end(self, epoch, logs=None):
        if not logs:
            return
        names = sorted(k for k, v in logs.items() if np.ndim(v) == 0)
        with tf.device(self.device):
            values = grouped_allreduce([tf.constant(float(logs[k]), tf.float64) for k in names], op=Average,
                                       name=f"metric_average.{epoch}")
        for k, v in zip(names, values):
            logs[k] = float(v.numpy())


class LearningRateScheduleCallback(keras.callbacks.Callback):
    """lr = initial_lr * multiplier(epoch) for epochs in [start_epoch, end_epoch):
    set at each epoch's start (staircase) or at every batch with a fractional epoch.
    momentum_correction scales a momentum held in a variable by new_lr / old_lr
    for the batch (Keras 3's SGD keeps momentum as a constant of its compiled
    step, which no callback can change)."""

    def __init__(self, initial_lr, multiplier, start_epoch=0, end_epoch=None, staircase=True,
                 momentum_correction=True, steps_per_epoch=None, *args):
        super().__init__()
        self.initial_lr = initial_lr
        self.multiplier = multiplier if callable(multiplier) else (lambda epoch: multiplier)
        self.start_epoch, self.end_epoch = start_epoch, end_epoch
        self.staircase = staircase
        self.momentum_correction = momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self.current_epoch = 0
        self._restore_momentum = None

    def _lr(self):
        return float(tf.convert_to_tensor(self.model.optimizer.learning_rate).numpy())

    def _set_lr(self, value):
        self.model.optimizer.learning_rate.assign(value)

    def _momentum_variable(self):
        m = getattr(self.model.optimizer, "momentum", None)
        return m if hasattr(m, "assign") else None

    def _adjust(self, epoch):
        old = self._lr()
        new = self.initial_lr * self.multiplier(epoch)
        self._set_lr(new)
        m = self._momentum_variable()
        if self.momentum_correction and m is not None and old > 0:
            self._restore_momentum = float(m.numpy())
            m.assign(self._restore_momentum * new / old)

    def on_train_begin(self, logs=None):
        if self.initial_lr is None:
            self.initial_lr = self._lr()
        if not self.staircase and not self.steps_per_epoch:
            self.steps_per_epoch = self.params.get("steps") if self.params else None
            if not self.steps_per_epoch:
                raise ValueError("steps_per_epoch is unknown (a dataset of unknown length): pass it")

    def on_epoch_begin(self, epoch, logs=None):
        self.current_epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        e = self.current_epoch
        if e < self.start_epoch or (self.end_epoch is not None and e >= self.end_epoch):
            return
        if self.staircase:
            if batch == 0:
                self._adjust(e)
        else:
            self._adjust(e + float(batch) / self.steps_per_epoch)

    def on_train_batch_end(self, batch, logs=None):
        if self._restore_momentum is not None:
            self._momentum_variable().assign(self._restore_momentum)
            self._restore_momentum = None

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["lr"] = self._lr()


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Goyal et al.'s gradual warm-up: from initial_lr / size to initial_lr over
    warmup_epochs, batch by batch (initial_lr is the rate for all ranks together)."""

    def __init__(self, initial_lr, warmup_epochs=5, momentum_correction=True, steps_per_epoch=None, verbose=0):
        def multiplier(epoch):
            epoch += 1.0 / self.steps_per_epoch  # whole numbers at each epoch's end
            n = basics.size()
            return 1.0 / n * (epoch * (n - 1) / warmup_epochs + 1)

        super().__init__(initial_lr, multiplier, start_epoch=0, end_epoch=warmup_epochs, staircase=False,
                         momentum_correction=momentum_correction, steps_per_epoch=steps_per_epoch)
        self.verbose = verbose

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, logs)
        if epoch == self.end_epoch - 1 and self.verbose > 0:
            print(f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to {self._lr():g}.")


class BestModelCheckpoint(keras.callbacks.ModelCheckpoint):
    """ModelCheckpoint that keeps only the best model (save_best_only), written by
    rank 0 alone. filepath may be set later (callback.filepath = ...)."""

    def __init__(self, filepath=None, monitor="val_loss", verbose=0, mode="auto", save_freq="epoch"):
        super().__init__(filepath=filepath or "best.keras", monitor=monitor, verbose=verbose,
                         save_best_only=True, save_weights_only=False, mode=mode, save_freq=save_freq)
        if filepath is None:
            self.filepath = None

    def _save_model(self, epoch, batch, logs):
        if self.filepath is None:
            raise ValueError("BestModelCheckpoint: set filepath before training")
        if basics.rank() == 0:
            super()._save_model(epoch, batch, logs)
