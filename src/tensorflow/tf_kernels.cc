// TensorFlow kernels over chorus's runtime. Each is an AsyncOpKernel: it starts
// the collective and returns; the runtime's thread finishes the kernel (outputs,
// status, done()) through Work::whenDone, so TensorFlow's threads never block on
// a peer. Outputs whose size negotiation decides are allocated by TensorFlow
// from inside the runtime (the Allocator hook): no copy.
#include <chrono>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "chorus/chorus.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace tensorflow {
namespace {

using chorus::Work;
namespace ch = chorus;

ch::Runtime& rt() { return ch::defaultRuntime(); }

ch::DataType toChorus(DataType t) {
  switch (t) {
    case DT_UINT8: return ch::DataType::kUInt8;
    case DT_INT8: return ch::DataType::kInt8;
    case DT_UINT16: return ch::DataType::kUInt16;
    case DT_INT16: return ch::DataType::kInt16;
    case DT_INT32: return ch::DataType::kInt32;
    case DT_INT64: return ch::DataType::kInt64;
    case DT_HALF: return ch::DataType::kFloat16;
    case DT_BFLOAT16: return ch::DataType::kBFloat16;
    case DT_FLOAT: return ch::DataType::kFloat32;
    case DT_DOUBLE: return ch::DataType::kFloat64;
    case DT_BOOL: return ch::DataType::kBool;
    default: throw ch::InvalidArgument("chorus does not carry TensorFlow dtype " + DataTypeString(t));
  }
}

ch::Tensor view(const Tensor& t) {
  const auto dims = t.shape().dim_sizes();  // (by value: one copy, both ends of it)
  ch::Shape shape(dims.begin(), dims.end());
  void* p = const_cast<char*>(t.tensor_data().data());
  return ch::Tensor{p, toChorus(t.dtype()), std::move(shape)};
}

// chorus's errors as TensorFlow's: a bad argument stays one, ranks that disagree
// are a failed precondition (as Horovod reports them), and a lost peer, timeout,
// stall or shutdown is Unknown, which Horovod's elastic loop catches.
absl::Status toStatus(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const ch::InvalidArgument& x) {
    return absl::InvalidArgumentError(x.what());
  } catch (const ch::Mismatch& x) {  // the ranks' requests disagree, or they refused the op
    return absl::FailedPreconditionError(x.what());
  } catch (const ch::Refused& x) {
    return absl::FailedPreconditionError(x.what());
  } catch (const std::exception& x) {
    return absl::UnknownError(x.what());
  }
}

void check(const absl::Status& s) {
  if (!s.ok()) throw ch::InvalidArgument(std::string(s.message()));
}

TensorShape tfShape(const ch::Shape& s) {
  TensorShape out;
  for (int64_t d : s) out.AddDim(d);
  return out;
}

// Output i allocated by TensorFlow when chorus knows its shape.
ch::Allocator allocatorFor(OpKernelContext* ctx, int i) {
  return [ctx, i](const ch::Shape& shape, ch::DataType) -> void* {
    Tensor* out = nullptr;
    check(ctx->allocate_output(i, tfShape(shape), &out));
    return out->data();
  };
}

// Outputs that chorus allocated (grouped ops), copied into TensorFlow's.
void copyOutputs(OpKernelContext* ctx, const Work& w) {
  for (size_t i = 0; i < w.outputs().size(); ++i) {
    const ch::Tensor& o = w.outputs()[i];
    Tensor* out = nullptr;
    check(ctx->allocate_output(static_cast<int>(i), tfShape(o.shape), &out));
    if (o.bytes()) std::memcpy(out->data(), o.data, o.bytes());
  }
}

// How long a kernel may run its op's cycles on TensorFlow's thread, and for
// which inputs: bounded, since TensorFlow's threads must not wait on peers
// (another op of the graph may be what they wait for).
constexpr std::chrono::microseconds kDriveBudget{300};
constexpr size_t kDriveMaxBytes = 64 << 10;

bool smallOp(OpKernelContext* ctx) {
  size_t bytes = 0;
  for (int i = 0; i < ctx->num_inputs(); ++i) bytes += ctx->input(i).TotalBytes();
  return bytes <= kDriveMaxBytes;
}

class ChorusKernel : public AsyncOpKernel {
 public:
  explicit ChorusKernel(OpKernelConstruction* c, bool named = true) : AsyncOpKernel(c) {
    int set = 0;
    OP_REQUIRES_OK(c, c->GetAttr("process_set_id", &set));
    opts_.processSet = set;
    if (!named) return;
    int priority = 0;
    OP_REQUIRES_OK(c, c->GetAttr("tensor_name", &opts_.name));
    OP_REQUIRES_OK(c, c->GetAttr("priority", &priority));
    opts_.priority = priority;
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    Work w(nullptr);
    try {
      w = start(ctx);
    } catch (...) {
      ctx->SetStatus(toStatus(std::current_exception()));
      done();
      return;
    }
    // A small op usually completes within a few cycles: run them here rather than
    // hand it to chorus's thread and be handed back (most of its latency).
    if (smallOp(ctx)) w.driveFor(kDriveBudget);
    w.whenDone([this, ctx, done = std::move(done), w]() {
      if (auto e = w.error()) {
        ctx->SetStatus(toStatus(e));
      } else {
        try {
          finish(ctx, w);
        } catch (...) {
          ctx->SetStatus(toStatus(std::current_exception()));
        }
      }
      done();
    });
  }

 protected:
  virtual Work start(OpKernelContext* ctx) = 0;
  // Outputs that are known only once the op is done.
  virtual void finish(OpKernelContext* ctx, const Work& w) {}

  template <typename O>
  O reduceOptions(OpKernelConstruction* c) {
    O o;
    static_cast<ch::OpOptions&>(o) = opts_;
    int op = 0;
    float pre = 1, post = 1;
    for (auto s : {c->GetAttr("reduce_op", &op), c->GetAttr("prescale_factor", &pre),
                   c->GetAttr("postscale_factor", &post)})
      if (!s.ok()) c->CtxFailure(__FILE__, __LINE__, s);
    o.op = static_cast<ch::ReduceOp>(op);
    o.prescaleFactor = pre;
    o.postscaleFactor = post;
    return o;
  }

  ch::OpOptions opts_;
};

// Every input of a grouped op.
std::vector<ch::Tensor> inputsOf(OpKernelContext* ctx) {
  std::vector<ch::Tensor> ins;
  for (int i = 0; i < ctx->num_inputs(); ++i) ins.push_back(view(ctx->input(i)));
  return ins;
}

// An output of the input's shape, in the input's buffer when TensorFlow allows.
ch::Tensor sameShapeOutput(OpKernelContext* ctx, int i) {
  Tensor* out = nullptr;
  check(ctx->forward_input_or_allocate_output({i}, i, ctx->input(i).shape(), &out));
  return view(*out);
}

class AllreduceOp : public ChorusKernel {
 public:
  explicit AllreduceOp(OpKernelConstruction* c) : ChorusKernel(c), ropts_(reduceOptions<ch::AllreduceOptions>(c)) {}
  Work start(OpKernelContext* ctx) override {
    return rt().allreduceAsync(view(ctx->input(0)), sameShapeOutput(ctx, 0), ropts_);
  }

 private:
  ch::AllreduceOptions ropts_;
};

class GroupedAllreduceOp : public ChorusKernel {
 public:
  explicit GroupedAllreduceOp(OpKernelConstruction* c)
      : ChorusKernel(c), ropts_(reduceOptions<ch::AllreduceOptions>(c)) {}
  Work start(OpKernelContext* ctx) override {
    std::vector<ch::Tensor> outs;
    for (int i = 0; i < ctx->num_inputs(); ++i) outs.push_back(sameShapeOutput(ctx, i));
    return rt().groupedAllreduceAsync(inputsOf(ctx), outs, ropts_);
  }

 private:
  ch::AllreduceOptions ropts_;
};

class AllgatherOp : public ChorusKernel {
 public:
  using ChorusKernel::ChorusKernel;
  Work start(OpKernelContext* ctx) override {
    return rt().allgatherAsync(view(ctx->input(0)), opts_, allocatorFor(ctx, 0));
  }
};

class GroupedAllgatherOp : public ChorusKernel {
 public:
  using ChorusKernel::ChorusKernel;
  Work start(OpKernelContext* ctx) override {
    return rt().groupedAllgatherAsync(inputsOf(ctx), opts_);
  }
  void finish(OpKernelContext* ctx, const Work& w) override { copyOutputs(ctx, w); }
};

class BroadcastOp : public ChorusKernel {
 public:
  explicit BroadcastOp(OpKernelConstruction* c) : ChorusKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("root_rank", &root_));
  }
  Work start(OpKernelContext* ctx) override {
    return rt().broadcastAsync(view(ctx->input(0)), sameShapeOutput(ctx, 0), root_, opts_);
  }

 private:
  int root_ = 0;
};

class AlltoallOp : public ChorusKernel {
 public:
  using ChorusKernel::ChorusKernel;
  Work start(OpKernelContext* ctx) override {
    const Tensor& s = ctx->input(1);
    auto flat = s.flat<int32_t>();
    std::vector<int64_t> splits(flat.data(), flat.data() + flat.size());
    return rt().alltoallAsync(view(ctx->input(0)), splits, opts_, allocatorFor(ctx, 0));
  }
  void finish(OpKernelContext* ctx, const Work& w) override {
    const auto& got = w.receivedSplits();
    Tensor* out = nullptr;
    check(ctx->allocate_output(1, TensorShape({static_cast<int64_t>(got.size())}), &out));
    auto flat = out->flat<int32_t>();
    for (size_t i = 0; i < got.size(); ++i) flat(i) = static_cast<int32_t>(got[i]);
  }
};

class ReducescatterOp : public ChorusKernel {
 public:
  explicit ReducescatterOp(OpKernelConstruction* c)
      : ChorusKernel(c), ropts_(reduceOptions<ch::ReducescatterOptions>(c)) {}
  Work start(OpKernelContext* ctx) override {
    return rt().reducescatterAsync(view(ctx->input(0)), ropts_, allocatorFor(ctx, 0));
  }

 private:
  ch::ReducescatterOptions ropts_;
};

class GroupedReducescatterOp : public ChorusKernel {
 public:
  explicit GroupedReducescatterOp(OpKernelConstruction* c)
      : ChorusKernel(c), ropts_(reduceOptions<ch::ReducescatterOptions>(c)) {}
  Work start(OpKernelContext* ctx) override {
    return rt().groupedReducescatterAsync(inputsOf(ctx), ropts_);
  }
  void finish(OpKernelContext* ctx, const Work& w) override { copyOutputs(ctx, w); }

 private:
  ch::ReducescatterOptions ropts_;
};

class BarrierOp : public ChorusKernel {
 public:
  explicit BarrierOp(OpKernelConstruction* c) : ChorusKernel(c, false) {}
  Work start(OpKernelContext*) override { return rt().barrierAsync(opts_.processSet); }
};

class JoinOp : public ChorusKernel {
 public:
  explicit JoinOp(OpKernelConstruction* c) : ChorusKernel(c, false) {}
  Work start(OpKernelContext*) override { return rt().joinAsync(opts_.processSet); }
  void finish(OpKernelContext* ctx, const Work& w) override {
    Tensor* out = nullptr;
    check(ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<int32_t>()() = w.joinResult();
  }
};

class QueryOp : public OpKernel {
 public:
  explicit QueryOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("what", &what_));
    OP_REQUIRES_OK(c, c->GetAttr("process_set_id", &set_));
    OP_REQUIRES(c, what_ == "size" || what_ == "rank" || what_ == "local_size" || what_ == "local_rank" ||
                       what_ == "process_set_included",
                absl::InvalidArgumentError("ChorusQuery: unknown query '" + what_ + "'"));
  }
  void Compute(OpKernelContext* ctx) override {
    int value = 0;
    try {
      if (!rt().isInitialized()) throw ch::InvalidArgument("chorus has not been initialized; use hvd.init()");
      if (what_ == "local_size") value = rt().localSize();
      else if (what_ == "local_rank") value = rt().localRank();
      else {
        const ch::ProcessSet ps = rt().processSet(set_);
        if (what_ == "size") value = ps.size();
        else if (what_ == "rank") value = ps.rank();
        else value = ps.included() ? 1 : 0;
      }
    } catch (...) {
      ctx->SetStatus(toStatus(std::current_exception()));
      return;
    }
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<int32_t>()() = value;
  }

 private:
  std::string what_;
  int set_ = 0;
};

REGISTER_KERNEL_BUILDER(Name("ChorusAllreduce").Device(DEVICE_CPU), AllreduceOp);
REGISTER_KERNEL_BUILDER(Name("ChorusGroupedAllreduce").Device(DEVICE_CPU), GroupedAllreduceOp);
REGISTER_KERNEL_BUILDER(Name("ChorusAllgather").Device(DEVICE_CPU), AllgatherOp);
REGISTER_KERNEL_BUILDER(Name("ChorusGroupedAllgather").Device(DEVICE_CPU), GroupedAllgatherOp);
REGISTER_KERNEL_BUILDER(Name("ChorusBroadcast").Device(DEVICE_CPU), BroadcastOp);
REGISTER_KERNEL_BUILDER(Name("ChorusAlltoall").Device(DEVICE_CPU), AlltoallOp);
REGISTER_KERNEL_BUILDER(Name("ChorusReducescatter").Device(DEVICE_CPU), ReducescatterOp);
REGISTER_KERNEL_BUILDER(Name("ChorusGroupedReducescatter").Device(DEVICE_CPU), GroupedReducescatterOp);
REGISTER_KERNEL_BUILDER(Name("ChorusBarrier").Device(DEVICE_CPU), BarrierOp);
REGISTER_KERNEL_BUILDER(Name("ChorusJoin").Device(DEVICE_CPU), JoinOp);
REGISTER_KERNEL_BUILDER(Name("ChorusQuery").Device(DEVICE_CPU), QueryOp);

}  // namespace
}  // namespace tensorflow
