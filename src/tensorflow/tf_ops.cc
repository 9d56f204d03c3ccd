// The TensorFlow ops chorus registers: their signatures and output shapes.
// Kernels are in tf_kernels.cc. Names are Chorus* so that Horovod's ops can be
// loaded in the same process.
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {
namespace {

using shape_inference::InferenceContext;
using shape_inference::ShapeHandle;

// The dtypes chorus's core carries.
#define CHORUS_TYPES "{uint8, int8, uint16, int16, int32, int64, half, bfloat16, float, double, bool}"

// Same shape as the input but the first dimension, known only once run.
absl::Status firstDimUnknown(InferenceContext* c, int i) {
  ShapeHandle in = c->input(i);
  if (!c->RankKnown(in)) {
    c->set_output(i, c->UnknownShape());
  } else if (c->Rank(in) == 0) {
    c->set_output(i, c->Vector(c->UnknownDim()));  // allgather of scalars: one per rank
  } else {
    ShapeHandle out;
    TF_RETURN_IF_ERROR(c->ReplaceDim(in, 0, c->UnknownDim(), &out));
    c->set_output(i, out);
  }
  return absl::OkStatus();
}

absl::Status sameShapes(InferenceContext* c) {
  for (int i = 0; i < c->num_inputs(); ++i) c->set_output(i, c->input(i));
  return absl::OkStatus();
}

absl::Status firstDimsUnknown(InferenceContext* c) {
  for (int i = 0; i < c->num_inputs(); ++i) TF_RETURN_IF_ERROR(firstDimUnknown(c, i));
  return absl::OkStatus();
}

// Every collective is stateful: it talks to the other ranks, so TensorFlow must
// never run it while folding constants (shape inference did, on one rank only,
// and hung) nor merge two of them. python/chorus/tensorflow/mpi_ops.py keeps
// tf.function from chaining them in program order, as it does stateful ops.

// tensor_name: how the ranks match this op (Python sets it: the graph node's
// name in a graph, the caller's name or "" eagerly, where "" means the next
// automatic name in call order).
#define CHORUS_COMMON_ATTRS .Attr("tensor_name: string = ''").Attr("process_set_id: int = 0").Attr("priority: int = 0")
#define CHORUS_REDUCE_ATTRS \
  .Attr("reduce_op: int").Attr("prescale_factor: float = 1.0").Attr("postscale_factor: float = 1.0")

REGISTER_OP("ChorusAllreduce")
    .Input("tensor: T")
    .Output("output: T")
    .Attr("T: " CHORUS_TYPES) CHORUS_REDUCE_ATTRS CHORUS_COMMON_ATTRS
    .SetIsStateful()
    .SetShapeFn(shape_inference::UnchangedShape);

REGISTER_OP("ChorusGroupedAllreduce")
    .Input("tensors: T")
    .Output("outputs: T")
    .Attr("T: list(" CHORUS_TYPES ")") CHORUS_REDUCE_ATTRS CHORUS_COMMON_ATTRS
    .SetIsStateful()
    .SetShapeFn(sameShapes);

REGISTER_OP("ChorusAllgather")
    .Input("tensor: T")
    .Output("output: T")
    .Attr("T: " CHORUS_TYPES) CHORUS_COMMON_ATTRS
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) { return firstDimUnknown(c, 0); });

REGISTER_OP("ChorusGroupedAllgather")
    .Input("tensors: T")
    .Output("outputs: T")
    .Attr("T: list(" CHORUS_TYPES ")") CHORUS_COMMON_ATTRS
    .SetIsStateful()
    .SetShapeFn(firstDimsUnknown);

REGISTER_OP("ChorusBroadcast")
    .Input("tensor: T")
    .Output("output: T")
    .Attr("T: " CHORUS_TYPES)
    .Attr("root_rank: int") CHORUS_COMMON_ATTRS
    .SetIsStateful()
    .SetShapeFn(shape_inference::UnchangedShape);

REGISTER_OP("ChorusAlltoall")
    .Input("tensor: T")
    .Input("splits: int32")
    .Output("output: T")
    .Output("received_splits: int32")
    .Attr("T: " CHORUS_TYPES) CHORUS_COMMON_ATTRS
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(firstDimUnknown(c, 0));
      c->set_output(1, c->Vector(c->UnknownDim()));
      return absl::OkStatus();
    });

REGISTER_OP("ChorusReducescatter")
    .Input("tensor: T")
    .Output("output: T")
    .Attr("T: " CHORUS_TYPES) CHORUS_REDUCE_ATTRS CHORUS_COMMON_ATTRS
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) { return firstDimUnknown(c, 0); });

REGISTER_OP("ChorusGroupedReducescatter")
    .Input("tensors: T")
    .Output("outputs: T")
    .Attr("T: list(" CHORUS_TYPES ")") CHORUS_REDUCE_ATTRS CHORUS_COMMON_ATTRS
    .SetIsStateful()
    .SetShapeFn(firstDimsUnknown);

// Ops without a data input are stateful: never folded, pruned or merged.
REGISTER_OP("ChorusBarrier").Attr("process_set_id: int = 0").SetIsStateful().SetShapeFn(shape_inference::NoOutputs);

REGISTER_OP("ChorusJoin")
    .Output("last_joined_rank: int32")
    .Attr("process_set_id: int = 0")
    .SetIsStateful()
    .SetShapeFn(shape_inference::ScalarShape);

// Ranks and sizes read when the graph runs (horovod's size_op, rank_op...).
// what: size, rank, local_size, local_rank, process_set_included.
REGISTER_OP("ChorusQuery")
    .Output("value: int32")
    .Attr("what: string")
    .Attr("process_set_id: int = 0")
    .SetIsStateful()
    .SetShapeFn(shape_inference::ScalarShape);

}  // namespace
}  // namespace tensorflow
