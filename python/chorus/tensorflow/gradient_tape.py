"""DistributedGradientTape, and the gradient allreduce it shares with the
distributed optimizers."""
import tensorflow as tf

from chorus.common.process_sets import global_process_set
from chorus.tensorflow.compression import Compression
from chorus.tensorflow.functions import _tf_variable, allreduce, grouped_allreduce
from chorus.tensorflow.mpi_ops import Adasum, Average, Sum
from chorus.common.util import split_list


class GradientReducer:
    """Averages (or sums) gradients over a process set as Horovod's optimizers do.

    In a graph each gradient gets its own op, started as soon as backward produces
    it (chorus fuses those that are ready together); eagerly, where ops run one at
    a time, they go as one grouped op. groups / num_groups force grouped ops."""

    def __init__(self, device_dense="", device_sparse="", compression=Compression.none, sparse_as_dense=False,
                 op=Average, gradient_predivide_factor=1.0, num_groups=0, groups=None,
                 process_set=global_process_set):
        if op not in (Average, Sum, Adasum):
            raise ValueError(f"op must be Average, Sum or Adasum, got {op!r}")
        if gradient_predivide_factor != 1.0 and op != Average:
            raise ValueError("gradient_predivide_factor needs op == Average")
        if groups is not None and num_groups:
            raise ValueError("give groups or num_groups, not both")
        if isinstance(groups, int):
            num_groups, groups = groups, None
        self.device_dense, self.device_sparse = device_dense, device_sparse
        self.compression, self.sparse_as_dense, self.op = compression, sparse_as_dense, op
        self.prescale = 1.0 / gradient_predivide_factor if op == Average else 1.0
        self.postscale = gradient_predivide_factor if op == Average else 1.0
        self.num_groups, self.groups, self.process_set = num_groups, groups, process_set

    def _prepare(self, g):
        if self.sparse_as_dense and isinstance(g, tf.IndexedSlices):
            return tf.convert_to_tensor(g)
        return g

    def partial(self, grads, variables, local, scale_local=True):
        """__call__ for all but the variables whose ids are in local: theirs stay this
        rank's own (scaled as the averaged ones are, unless scale_local is false)."""
        grads = list(grads)
        if not local:
            return self(grads, variables)
        shared = [i for i, v in enumerate(variables) if id(_tf_variable(v)) not in local]
        out = list(grads)
        if shared and self.process_set.included():
            for i, g in zip(shared, self([grads[i] for i in shared], [variables[i] for i in shared])):
                out[i] = g
        if scale_local and self.op == Average and self.process_set.included():
            n = self.process_set.size()
            out = [g / n if g is not None and i not in shared else g for i, g in enumerate(out)]
        return out

    def __call__(self, grads, variables=None):
        """The reduced gradients, None where a gradient is None; a rank outside the
        process set gets its own gradients back, as Horovod's optimizers give them."""
        grads = list(grads)  # (reduced even on one rank: a traced step must not bake in the size)
        if not self.process_set.included():
            return grads
        idx = [i for i, g in enumerate(grads) if g is not None]
        present = [self._prepare(grads[i]) for i in idx]
        kw = dict(device_dense=self.device_dense, device_sparse=self.device_sparse, compression=self.compression,
                  op=self.op, prescale_factor=self.prescale, postscale_factor=self.postscale,
                  process_set=self.process_set)
        if self.groups is not None:
            buckets = self._explicit_groups(idx, variables)
        elif self.num_groups:
            buckets = [b for b in split_list(list(range(len(present))), self.num_groups) if b]
        elif tf.executing_eagerly():
            buckets = [list(range(len(present)))]
        else:
            buckets = None
        if buckets is None:
            reduced = [allreduce(g, **kw) for g in present]
        else:
            reduced = [None] * len(present)
            for b in buckets:
                for j, r in zip(b, grouped_allreduce([present[j] for j in b], **kw)):
                    reduced[j] = r
        out = list(grads)
        for i, r in zip(idx, reduced):
            out[i] = r
        return out

    def _explicit_groups(self, idx, variables):
        """groups: lists of variables reduced together; the rest one by one."""
        if variables is None:
            raise ValueError("groups of variables need the variables the gradients belong to")
        position = {id(_tf_variable(v)): k for k, v in enumerate(variables[i] for i in idx)}
        buckets, seen = [], set()
        for group in self.groups:
            b = [position[id(_tf_variable(v))] for v in group if id(_tf_variable(v)) in position]
            seen.update(b)
            if b:
                buckets.append(b)
        buckets += [[k] for k in range(len(idx)) if k not in seen]
        return buckets


class _DistributedGradientTape(tf.GradientTape):
    def gradient(self, target, sources, output_gradients=None, unconnected_gradients=tf.UnconnectedGradients.NONE):
        grads = super().gradient(target, sources, output_gradients, unconnected_gradients)
        flat = tf.nest.flatten(grads)
        flat_sources = tf.nest.flatten(sources)
        out = self._chorus_reducer.partial(flat, flat_sources, self._chorus_local, self._chorus_scale_local)
        return tf.nest.pack_sequence_as(grads, out)

    def register_local_source(self, source):
        """Gradients of this variable stay this rank's own (no collective), as Horovod's."""
        self._chorus_local.add(id(_tf_variable(source)))


def DistributedGradientTape(gradtape, device_dense="", device_sparse="", compression=Compression.none,
                            sparse_as_dense=False, op=Average, gradient_predivide_factor=1.0, num_groups=0,
                            groups=None, process_set=global_process_set, scale_local_gradients=True):
    """Wraps a tf.GradientTape (after recording) so that gradient() returns the
    gradients averaged over the ranks of the process set."""
    cls = type(gradtape.__class__.__name__, (_DistributedGradientTape, gradtape.__class__), {})
    tape = cls.__new__(cls)
    tape.__dict__.update(gradtape.__dict__)  # the recording so far, shared
    tape._chorus_reducer = GradientReducer(device_dense, device_sparse, compression, sparse_as_dense, op,
                                           gradient_predivide_factor, num_groups, groups, process_set)
    tape._chorus_local = set()
    tape._chorus_scale_local = scale_local_gradients
    return tape
