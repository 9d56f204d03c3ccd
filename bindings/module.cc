// chorus._core: the Python binding over include/chorus. Tensors cross as raw
// pointers (no copies); outputs that chorus allocates come back as numpy arrays
// that keep the op's storage alive.
#include <functional>
#include <optional>

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "chorus/chorus.h"
#include "reduce/cpu_optimizer.h"

namespace py = pybind11;
using namespace chorus;

void bindZero(py::module_& m);
void bindCluster(py::module_& m);

namespace {

// device: -1 host memory, else the CUDA ordinal (the pointer is device memory).
Tensor view(uintptr_t ptr, int dtype, const std::vector<int64_t>& shape, int device = kHostDevice) {
  return Tensor{reinterpret_cast<void*>(ptr), static_cast<DataType>(dtype), shape, device};
}

// Asked while a call waits with the interpreter lock released: runs Python's
// signal handlers (on the main thread), true when one raised (KeyboardInterrupt...).
bool pythonSignalled() {
  py::gil_scoped_acquire gil;
  return PyErr_CheckSignals() != 0;
}
const std::function<bool()> kSignalled = pythonSignalled;

// The op a blocking call gave up on, still in flight: Python keeps its tensors
// alive until it is done (mpi_ops takes it with take_interrupted()).
thread_local std::optional<Work> tlsInterrupted;

// One async op as Python sees it.
struct PyWork {
  Work work;
  bool poll() const { return work.poll(); }
  void wait() const {
    bool finished;
    {
      py::gil_scoped_release release;
      finished = work.waitUnless(kSignalled);
    }
    if (!finished) throw py::error_already_set();  // the handler's exception
  }
  size_t numOutputs() const { return work.outputs().size(); }
  std::vector<int64_t> outputShape(size_t i) const { return work.outputs().at(i).shape; }
  // Bytes of output i as a uint8 array sharing the op's storage.
  py::array outputBytes(size_t i) const {
    const Tensor& t = work.outputs().at(i);
    auto* holder = new std::shared_ptr<WorkState>(work.state());
    py::capsule base(holder, [](void* p) { delete static_cast<std::shared_ptr<WorkState>*>(p); });
    return py::array_t<uint8_t>({static_cast<py::ssize_t>(t.bytes())}, {1},
                                static_cast<uint8_t*>(t.data), base);
  }
  // A CUDA output: its device pointer (chorus's memory, alive while the Work is).
  uintptr_t outputPtr(size_t i) const { return reinterpret_cast<uintptr_t>(work.outputs().at(i).data); }
  int outputDevice(size_t i) const { return work.outputs().at(i).device; }
  // CUDA tensors: work queued on stream (a cudaStream_t) after this sees the results.
  void streamWait(uintptr_t stream) const { work.streamWait(reinterpret_cast<void*>(stream)); }
  std::vector<int64_t> receivedSplits() const { return work.receivedSplits(); }
  int joinResult() const { return work.joinResult(); }
};

Runtime& rt() { return defaultRuntime(); }

// wait: the op is waited for inside the call, on this thread, which runs its
// negotiation itself (Runtime::submitAndWait); the Work comes back done.
template <typename Submit>
PyWork start(bool wait, Submit submit) {
  if (!wait) return PyWork{submit()};
  try {
    py::gil_scoped_release release;
    return PyWork{rt().submitAndWaitUnless(submit, kSignalled)};
  } catch (const Interrupted& e) {
    tlsInterrupted = e.work();
    throw py::error_already_set();
  }
}

template <typename O = OpOptions>
O opOptions(const std::string& name, int32_t processSet, int32_t priority, uintptr_t stream = 0) {
  O o;
  o.name = name;
  o.processSet = processSet;
  o.priority = priority;
  o.stream = reinterpret_cast<void*>(stream);
  return o;
}

// Allreduce and reducescatter options share these fields.
template <typename O>
O reduceOptions(const std::string& name, int op, double prescale, double postscale, int32_t processSet,
                int32_t priority, uintptr_t stream = 0) {
  O o = opOptions<O>(name, processSet, priority, stream);
  o.op = static_cast<ReduceOp>(op);
  o.prescaleFactor = prescale;
  o.postscaleFactor = postscale;
  return o;
}

std::vector<Tensor> views(const std::vector<uintptr_t>& ptrs, const std::vector<int>& dtypes,
                          const std::vector<std::vector<int64_t>>& shapes, int device = kHostDevice) {
  std::vector<Tensor> out;
  for (size_t i = 0; i < ptrs.size(); ++i) out.push_back(view(ptrs[i], dtypes.at(i), shapes.at(i), device));
  return out;
}

// Every collective binding ends with these: the tensors' CUDA device (-1: host
// memory) and the stream they are ready on (0: the default stream).
#define CHORUS_DEVICE_ARGS py::arg("device") = -1, py::arg("stream") = 0

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "chorus runtime (C++ core)";

  // Exceptions: chorus's C++ types mapped onto a Python hierarchy whose wait-time
  // failures all derive from HorovodInternalError, as Horovod's do.
  static py::exception<Error> chorusError(m, "ChorusError", PyExc_RuntimeError);
  static py::exception<PeerFailure> internalError(m, "HorovodInternalError", chorusError.ptr());
  static py::exception<Mismatch> mismatchError(m, "MismatchError", internalError.ptr());
  static py::exception<Timeout> timeoutError(m, "TimeoutError", internalError.ptr());
  static py::exception<ShutdownError> shutdownError(m, "ShutdownError", internalError.ptr());
  static py::exception<StallError> stallError(m, "StallError", internalError.ptr());
  static py::exception<Refused> refusedError(m, "RefusedError", internalError.ptr());
  static py::exception<InvalidArgument> invalidArgument(m, "InvalidArgument", PyExc_ValueError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const InvalidArgument& e) {
      invalidArgument(e.what());
    } catch (const Refused& e) {
      refusedError(e.what());
    } catch (const Mismatch& e) {
      mismatchError(e.what());
    } catch (const Timeout& e) {
      timeoutError(e.what());
    } catch (const PeerFailure& e) {
      internalError(e.what());
    } catch (const ShutdownError& e) {
      shutdownError(e.what());
    } catch (const StallError& e) {
      stallError(e.what());
    } catch (const Error& e) {
      chorusError(e.what());
    }
  });

  py::class_<PyWork>(m, "Work")
      .def("poll", &PyWork::poll)
      .def("wait", &PyWork::wait)
      .def("num_outputs", &PyWork::numOutputs)
      .def("output_shape", &PyWork::outputShape)
      .def("output_bytes", &PyWork::outputBytes)
      .def("received_splits", &PyWork::receivedSplits)
      .def("output_ptr", &PyWork::outputPtr)
      .def("output_device", &PyWork::outputDevice)
      .def("stream_wait", &PyWork::streamWait)
      .def("join_result", &PyWork::joinResult);

  // Memory that the other ranks on this host can write into (hvd.allreduce's new tensors).
  m.attr("SHARED_MIN_BYTES") = kSharedMinBytes;
  m.def("shared_buffer", [](size_t bytes) {
    auto* holder = new std::shared_ptr<void>(allocateShared(bytes));
    py::capsule base(holder, [](void* p) { delete static_cast<std::shared_ptr<void>*>(p); });
    return py::array_t<uint8_t>({static_cast<py::ssize_t>(bytes)}, {1}, static_cast<uint8_t*>(holder->get()), base);
  });
  m.def("init", [](const std::vector<std::vector<int>>& processSets, bool dynamic, int64_t mpiComm) {
    Config c;
    c.processSets = processSets;
    c.dynamicProcessSets = dynamic;
    c.mpiCommHandle = mpiComm;
    py::gil_scoped_release release;
    rt().init(c);
  }, py::arg("process_sets") = std::vector<std::vector<int>>{}, py::arg("dynamic") = false,
     py::arg("mpi_comm") = int64_t{-2});
  m.def("shutdown", [] {
    py::gil_scoped_release release;
    rt().shutdown();
  });
  m.def("is_initialized", [] { return rt().isInitialized(); });
  m.def("mpi_built", [] { return mpiBuilt(); });
  m.def("cuda_built", [] { return cudaBuilt(); });
  // The op log (DeepSpeed's comms logger): (op, bytes, seconds, set size, process set) per tensor.
  m.def("set_op_log", [](bool on) { rt().setOpLog(on); });
  m.def("take_op_log", [](bool settle) {
    std::vector<std::tuple<std::string, int64_t, double, int, int32_t>> out;
    std::vector<OpRecord> records;
    {
      py::gil_scoped_release release;
      records = rt().takeOpLog(settle);
    }
    for (auto& r : records) out.emplace_back(std::move(r.op), r.bytes, r.seconds, r.setSize, r.processSet);
    return out;
  }, py::arg("settle") = true);
  m.def("process_set_stats", [](int32_t id) {
    const ProcessSetStats s = rt().stats(id);
    py::dict d;
    d["cycles"] = s.cycles;
    d["negotiated_ops"] = s.negotiatedOps;
    d["cached_ops"] = s.cachedOps;
    d["allreduce_batches"] = s.allreduceBatches;
    d["allreduce_tensors"] = s.allreduceTensors;
    d["payload_ops"] = s.payloadOps;
    d["fusion_threshold_bytes"] = s.fusionThresholdBytes;
    d["cycle_time_ms"] = s.cycleTimeMs;
    d["gpu_path"] = s.gpuPath;
    d["gpu_path_reason"] = s.gpuPathReason;
    py::list ops;
    for (const OpStat& o : s.ops) {
      py::dict e;
      e["op"] = o.op;
      e["path"] = o.path;
      e["count"] = o.count;
      e["tensors"] = o.tensors;
      e["bytes"] = o.bytes;
      e["seconds"] = o.seconds;
      ops.append(e);
    }
    d["ops"] = ops;
    return d;
  });
  m.def("nccl_built", [] { return ncclBuilt(); });
  m.def("set_nccl_search_path", [](std::vector<std::string> folders) { setNcclSearchPath(std::move(folders)); });
  m.def("mpi_enabled", [] { return rt().mpiEnabled(); });
  m.def("mpi_threads_supported", [] { return rt().mpiThreadsSupported(); });
  m.def("gloo_enabled", [] { return rt().glooEnabled(); });
  m.def("torch_master", [] { return rt().torchMaster(); });
  m.def("rank", [] { return rt().rank(); });
  m.def("size", [] { return rt().size(); });
  m.def("local_rank", [] { return rt().localRank(); });
  m.def("local_size", [] { return rt().localSize(); });
  m.def("cross_rank", [] { return rt().crossRank(); });
  m.def("cross_size", [] { return rt().crossSize(); });
  m.def("is_homogeneous", [] { return rt().isHomogeneous(); });

  m.def("process_set_ranks", [](int32_t id) { return rt().processSet(id).ranks(); });
  // A token: while it lives, this rank counts as waiting on the set (see Runtime::waitingElsewhere).
  m.def("waiting_elsewhere", [](int32_t id) {
    auto* token = new std::shared_ptr<void>(rt().waitingElsewhere(id));
    return py::capsule(token, [](void* p) { delete static_cast<std::shared_ptr<void>*>(p); });
  });
  m.def("process_set_ids", [] {
    std::vector<int32_t> ids;
    for (const auto& ps : rt().processSets()) ids.push_back(ps.id());
    return ids;
  });
  m.def("add_process_set", [](const std::vector<int>& ranks) {
    py::gil_scoped_release release;
    return rt().addProcessSet(ranks).id();
  });
  m.def("remove_process_set", [](int32_t id) {
    py::gil_scoped_release release;
    rt().removeProcessSet(id);
  });

  m.def("grouped_allreduce_async",
        [](const std::vector<uintptr_t>& in, const std::vector<uintptr_t>& out, const std::vector<int>& dtypes,
           const std::vector<std::vector<int64_t>>& shapes, const std::string& name, int op, double prescale,
           double postscale, int32_t processSet, int32_t priority, bool wait, int device, uintptr_t stream) {
          auto o = reduceOptions<AllreduceOptions>(name, op, prescale, postscale, processSet, priority, stream);
          return start(wait, [&] {
            return rt().groupedAllreduceAsync(views(in, dtypes, shapes, device), views(out, dtypes, shapes, device), o);
          });
        },
        py::arg("inputs"), py::arg("outputs"), py::arg("dtypes"), py::arg("shapes"), py::arg("name"), py::arg("op"),
        py::arg("prescale"), py::arg("postscale"), py::arg("process_set"), py::arg("priority"), py::arg("wait"),
        CHORUS_DEVICE_ARGS);
  // One tensor, waited for in the call (hvd.allreduce and allreduce_ with no
  // autograd or compression): no Work, lists or handle crossing into Python.
  m.def("allreduce_now",
        [](uintptr_t in, uintptr_t out, int dtype, const std::vector<int64_t>& shape, const std::string& name, int op,
           double prescale, double postscale, int32_t processSet, int32_t priority) {
          auto o = reduceOptions<AllreduceOptions>(name, op, prescale, postscale, processSet, priority);
          start(true, [&] { return rt().allreduceAsync(view(in, dtype, shape), view(out, dtype, shape), o); });
        });
  m.def("grouped_allgather_async",
        [](const std::vector<uintptr_t>& in, const std::vector<int>& dtypes,
           const std::vector<std::vector<int64_t>>& shapes, const std::string& name, int32_t processSet,
           int32_t priority, bool wait, int device, uintptr_t stream) {
          auto o = opOptions(name, processSet, priority, stream);
          return start(wait, [&] { return rt().groupedAllgatherAsync(views(in, dtypes, shapes, device), o); });
        },
        py::arg("inputs"), py::arg("dtypes"), py::arg("shapes"), py::arg("name"), py::arg("process_set"),
        py::arg("priority"), py::arg("wait"), CHORUS_DEVICE_ARGS);
  m.def("broadcast_async",
        [](uintptr_t in, uintptr_t out, int dtype, const std::vector<int64_t>& shape, int root,
           const std::string& name, int32_t processSet, int32_t priority, bool wait, int device, uintptr_t stream) {
          auto o = opOptions(name, processSet, priority, stream);
          return start(wait, [&] {
            return rt().broadcastAsync(view(in, dtype, shape, device), view(out, dtype, shape, device), root, o);
          });
        },
        py::arg("input"), py::arg("output"), py::arg("dtype"), py::arg("shape"), py::arg("root"), py::arg("name"),
        py::arg("process_set"), py::arg("priority"), py::arg("wait"), CHORUS_DEVICE_ARGS);
  m.def("alltoall_async",
        [](uintptr_t in, int dtype, const std::vector<int64_t>& shape, const std::vector<int64_t>& splits,
           const std::string& name, int32_t processSet, int32_t priority, bool wait, int device, uintptr_t stream) {
          auto o = opOptions(name, processSet, priority, stream);
          return start(wait, [&] { return rt().alltoallAsync(view(in, dtype, shape, device), splits, o); });
        },
        py::arg("input"), py::arg("dtype"), py::arg("shape"), py::arg("splits"), py::arg("name"),
        py::arg("process_set"), py::arg("priority"), py::arg("wait"), CHORUS_DEVICE_ARGS);
  m.def("grouped_reducescatter_async",
        [](const std::vector<uintptr_t>& in, const std::vector<int>& dtypes,
           const std::vector<std::vector<int64_t>>& shapes, const std::string& name, int op, double prescale,
           double postscale, int32_t processSet, int32_t priority, bool wait, int device, uintptr_t stream) {
          auto o = reduceOptions<ReducescatterOptions>(name, op, prescale, postscale, processSet, priority, stream);
          return start(wait, [&] { return rt().groupedReducescatterAsync(views(in, dtypes, shapes, device), o); });
        },
        py::arg("inputs"), py::arg("dtypes"), py::arg("shapes"), py::arg("name"), py::arg("op"), py::arg("prescale"),
        py::arg("postscale"), py::arg("process_set"), py::arg("priority"), py::arg("wait"), CHORUS_DEVICE_ARGS);
  m.def("barrier_async", [](int32_t processSet, bool wait) {
    return start(wait, [&] { return rt().barrierAsync(processSet); });
  });
  // Point-to-point: peers are global ranks; wait: done inside the call.
  m.def(
      "send_async",
      [](uintptr_t ptr, int dtype, const std::vector<int64_t>& shape, int dst, int32_t tag, int32_t processSet,
         bool wait, int device, uintptr_t stream) {
        SendRecvOptions o{processSet, tag, reinterpret_cast<void*>(stream)};
        return start(wait, [&] { return rt().sendAsync(view(ptr, dtype, shape, device), dst, o); });
      },
      py::arg("ptr"), py::arg("dtype"), py::arg("shape"), py::arg("dst"), py::arg("tag"), py::arg("process_set"),
      py::arg("wait"), CHORUS_DEVICE_ARGS);
  m.def(
      "recv_async",
      [](uintptr_t ptr, int dtype, const std::vector<int64_t>& shape, int src, int32_t tag, int32_t processSet,
         bool wait, int device, uintptr_t stream) {
        SendRecvOptions o{processSet, tag, reinterpret_cast<void*>(stream)};
        return start(wait, [&] { return rt().recvAsync(view(ptr, dtype, shape, device), src, o); });
      },
      py::arg("ptr"), py::arg("dtype"), py::arg("shape"), py::arg("src"), py::arg("tag"), py::arg("process_set"),
      py::arg("wait"), CHORUS_DEVICE_ARGS);
  m.def(
      "batch_send_recv",
      [](const std::vector<bool>& sends, const std::vector<uintptr_t>& ptrs, const std::vector<int>& dtypes,
         const std::vector<std::vector<int64_t>>& shapes, const std::vector<int>& peers,
         const std::vector<int32_t>& tags, int32_t processSet, int device, uintptr_t stream) {
        std::vector<P2pOp> ops;
        for (size_t i = 0; i < ptrs.size(); ++i)
          ops.push_back(P2pOp{sends.at(i), view(ptrs[i], dtypes.at(i), shapes.at(i), device), peers.at(i), tags.at(i)});
        std::vector<PyWork> out;
        for (auto& w : rt().batchSendRecvAsync(ops, processSet, reinterpret_cast<void*>(stream)))
          out.push_back(PyWork{std::move(w)});
        return out;
      },
      py::arg("sends"), py::arg("ptrs"), py::arg("dtypes"), py::arg("shapes"), py::arg("peers"), py::arg("tags"),
      py::arg("process_set"), CHORUS_DEVICE_ARGS);
  m.def("join_async", [](int32_t processSet, bool wait) {
    return start(wait, [&] { return rt().joinAsync(processSet); });
  });
  m.def("cpu_adam_step",
        [](uintptr_t params, uintptr_t grads, uintptr_t expAvg, uintptr_t expAvgSq, size_t n, float lr, float beta1,
           float beta2, float eps, float weightDecay, int64_t step, bool adamw, uintptr_t low, int lowDtype,
           bool biasCorrection) {
          AdamHyper h{lr, beta1, beta2, eps, weightDecay, adamw, step, 1.0f, biasCorrection};
          py::gil_scoped_release release;
          cpuAdamStep(h, reinterpret_cast<float*>(params), reinterpret_cast<const float*>(grads),
                            reinterpret_cast<float*>(expAvg), reinterpret_cast<float*>(expAvgSq), n,
                            reinterpret_cast<void*>(low), static_cast<DataType>(lowDtype));
        },
        py::arg("params"), py::arg("grads"), py::arg("exp_avg"), py::arg("exp_avg_sq"), py::arg("n"), py::arg("lr"),
        py::arg("beta1"), py::arg("beta2"), py::arg("eps"), py::arg("weight_decay"), py::arg("step"),
        py::arg("adamw"), py::arg("low") = 0, py::arg("low_dtype") = static_cast<int>(DataType::kBFloat16),
        py::arg("bias_correction") = true);
  m.def("adam_simd_level", [] { return std::string(adamSimdLevel()); });
  // Lion, Adagrad and LAMB on one flat fp32 tensor in place (chorus.deepspeed.ops' CPU optimizers).
  m.def("cpu_lion_step", [](uintptr_t p, uintptr_t g, uintptr_t expAvg, size_t n, float lr, float beta1, float beta2,
                            float weightDecay) {
    py::gil_scoped_release release;
    cpuLionStep(LionCoefficients{lr, beta1, beta2, 1.0f - lr * weightDecay, 1.0f}, reinterpret_cast<float*>(p),
                reinterpret_cast<const float*>(g), reinterpret_cast<float*>(expAvg), n);
  });
  m.def("cpu_adagrad_step", [](uintptr_t p, uintptr_t g, uintptr_t sum, size_t n, float lr, float eps,
                               float weightDecay) {
    py::gil_scoped_release release;
    cpuAdagradStep(AdagradCoefficients{lr, eps, weightDecay, 1.0f}, reinterpret_cast<float*>(p),
                   reinterpret_cast<const float*>(g), reinterpret_cast<float*>(sum), n);
  });
  // One tensor's LAMB step (its own trust ratio); returns the ratio, as FusedLamb's lamb_coeffs.
  m.def("cpu_lamb_step", [](uintptr_t p, uintptr_t g, uintptr_t expAvg, uintptr_t expAvgSq, size_t n, float lr,
                            float beta1, float beta2, float eps, float weightDecay, int64_t step, bool biasCorrection,
                            bool epsInsideSqrt, float maxCoeff, float minCoeff, float gradScale) {
    LambHyper h{lr, beta1, beta2, eps, weightDecay, maxCoeff, minCoeff, biasCorrection, epsInsideSqrt, step, gradScale};
    const LambCoefficients c = lambCoefficients(h);
    py::gil_scoped_release release;
    double wsq = 0.0, usq = 0.0;
    auto* param = reinterpret_cast<float*>(p);
    auto* m = reinterpret_cast<float*>(expAvg);
    auto* v = reinterpret_cast<float*>(expAvgSq);
    cpuLambMoments(c, param, reinterpret_cast<const float*>(g), m, v, n, &wsq, &usq);
    const float trust = lambTrust(c, wsq, usq);
    cpuLambApply(c, trust, param, m, v, n);
    return trust;
  });
  m.def("take_interrupted", []() -> std::optional<PyWork> {
    if (!tlsInterrupted) return std::nullopt;
    PyWork w{*tlsInterrupted};
    tlsInterrupted.reset();
    return w;
  });
  m.def("synchronize", [] {
    py::gil_scoped_release release;
    rt().synchronize();
  });
  m.def("start_timeline", [](const std::string& path, bool markCycles) { rt().startTimeline(path, markCycles); },
        py::arg("file_path"), py::arg("mark_cycles") = false);
  m.def("stop_timeline", [] { rt().stopTimeline(); });
  m.def("elastic_join_next_round", [] {
    py::gil_scoped_release release;
    return rt().elasticJoinNextRound();
  });
  m.def("elastic_host_updates", [] {
    py::gil_scoped_release release;
    return rt().elasticHostUpdates();
  });
  bindZero(m);
  bindCluster(m);
}
