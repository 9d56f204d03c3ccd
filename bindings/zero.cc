// chorus._core's ZeRO part: the engine, the DeepSpeed config parser, checkpoint
// files and the learning-rate schedules. Engine memory is lent to Python as
// numpy arrays whose base keeps the owner (engine or gathered buffer) alive;
// device memory as a DeviceBlock (__cuda_array_interface__) that torch.as_tensor
// views in place, holding the owner likewise.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <map>
#include <optional>

#include "chorus/chorus.h"
#include "device/device_handles.h"
#include "device/loader.h"
#include "reduce/cpu_optimizer.h"
#include "zero/engine.h"
#include "zero/shard_file.h"

namespace py = pybind11;
using namespace chorus;
using zero::Engine;

namespace {

template <typename Owner>
py::array lend(std::shared_ptr<Owner> owner, void* data, size_t bytes) {
  auto* holder = new std::shared_ptr<Owner>(std::move(owner));
  py::capsule base(holder, [](void* p) { delete static_cast<std::shared_ptr<Owner>*>(p); });
  return py::array_t<uint8_t>({static_cast<py::ssize_t>(bytes)}, {1}, static_cast<uint8_t*>(data), base);
}

struct DeviceBlock {
  uintptr_t ptr;
  size_t bytes;
  int device;
  std::shared_ptr<void> owner;
};

// Host memory as numpy, device memory as a DeviceBlock.
template <typename Owner>
py::object lendAny(const Engine& e, std::shared_ptr<Owner> owner, void* data, size_t bytes) {
  if (!e.onDevice(data)) return lend(std::move(owner), data, bytes);
  return py::cast(DeviceBlock{reinterpret_cast<uintptr_t>(data), bytes, e.device(), std::move(owner)});
}

py::dict configDict(const zero::DsConfig& c) {
  py::dict d;
  d["train_batch_size"] = c.trainBatchSize;
  d["train_micro_batch_size_per_gpu"] = c.microBatch;
  d["gradient_accumulation_steps"] = c.gradAccum;
  d["gradient_clipping"] = c.gradientClipping;
  d["fp16"] = c.fp16.enabled;
  d["bf16"] = c.bf16;
  d["stage"] = c.zero.stage;
  d["offload_optimizer"] = c.zero.offloadOptimizer;
  d["offload_param"] = c.zero.offloadParam;
  d["pin_memory"] = c.zero.pinMemory;
  d["prefetch_bucket_size"] = c.zero.prefetchBucketSize;
  d["max_live_parameters"] = c.zero.maxLiveParameters;
  d["param_persistence_threshold"] = c.zero.paramPersistenceThreshold;
  d["reduce_bucket_size"] = c.zero.reduceBucketSize;
  if (c.optimizer.present) {
    py::dict o;
    // As DeepSpeed does: type Adam means AdamW unless adam_w_mode is false.
    o["type"] = c.optimizer.type == "adam" && c.optimizer.adamWMode ? "adamw" : c.optimizer.type;
    o["lr"] = c.optimizer.lr;
    o["betas"] = py::make_tuple(c.optimizer.beta1, c.optimizer.beta2);
    o["eps"] = c.optimizer.eps;
    o["weight_decay"] = c.optimizer.weightDecay;
    o["momentum"] = c.optimizer.momentum;
    d["optimizer"] = o;
  } else {
    d["optimizer"] = py::none();
  }
  if (c.scheduler.present) {
    py::dict s;
    s["type"] = c.scheduler.type;
    d["scheduler"] = s;
  } else {
    d["scheduler"] = py::none();
  }
  return d;
}

zero::GroupHyper groupHyper(const py::dict& g) {
  zero::GroupHyper h;
  auto num = [&](const char* k, float fallback) { return g.contains(k) ? g[k].cast<float>() : fallback; };
  h.lr = num("lr", h.lr);
  if (g.contains("betas")) {
    auto b = g["betas"].cast<std::pair<float, float>>();
    h.beta1 = b.first;
    h.beta2 = b.second;
  }
  h.eps = num("eps", h.eps);
  h.weightDecay = num("weight_decay", 0.0f);
  h.momentum = num("momentum", 0.0f);
  h.dampening = num("dampening", 0.0f);
  h.nesterov = g.contains("nesterov") && g["nesterov"].cast<bool>();
  h.lrDecay = num("lr_decay", 0.0f);
  h.initialAccumulator = num("initial_accumulator_value", 0.0f);
  h.maxCoeff = num("max_coeff", h.maxCoeff);
  h.minCoeff = num("min_coeff", h.minCoeff);
  h.biasCorrection = !g.contains("bias_correction") || g["bias_correction"].cast<bool>();
  h.epsInsideSqrt = g.contains("eps_inside_sqrt") && g["eps_inside_sqrt"].cast<bool>();
  return h;
}

}  // namespace

void bindZero(py::module_& m) {
  // The device backend's fused Adam/AdamW over tensors given by address (the
  // GPU benchmark against torch's Adam(fused=True)): each of tensors is
  // (master, exp_avg, exp_avg_sq, grad, low or 0, numel), on `device`, queued on `stream`.
  m.def("device_adam",
        [](const py::dict& group, int64_t step, float gradScale, bool adamw,
           const std::vector<std::tuple<uintptr_t, uintptr_t, uintptr_t, uintptr_t, uintptr_t, size_t>>& tensors,
           int gradDtype, int lowDtype, int device, uintptr_t stream) {
          const zero::GroupHyper g = groupHyper(group);
          AdamHyper h{g.lr, g.beta1, g.beta2, g.eps, g.weightDecay, adamw, step, gradScale};
          std::vector<OptimTensor> ts;
          for (const auto& [m, a, v, gr, lo, n] : tensors)
            ts.push_back({reinterpret_cast<float*>(m), reinterpret_cast<float*>(a), reinterpret_cast<float*>(v),
                          reinterpret_cast<const void*>(gr), reinterpret_cast<void*>(lo), n});
          auto b = openCudaBackend();
          py::gil_scoped_release release;
          CurrentDevice on(*b, device);
          b->adam(adamCoefficients(h), static_cast<DataType>(gradDtype), static_cast<DataType>(lowDtype),
                  ts.data(), ts.size(), reinterpret_cast<void*>(stream));
        },
        py::arg("group"), py::arg("step"), py::arg("grad_scale"), py::arg("adamw"), py::arg("tensors"),
        py::arg("grad_dtype"), py::arg("low_dtype"), py::arg("device"), py::arg("stream"));

  m.def("ds_config_parse", [](const std::string& json, int world) {
    return configDict(zero::DsConfig::parse(json, world));
  });
  m.def("write_file_atomic", [](const std::string& path, const py::bytes& data) {
    std::string s = data;
    py::gil_scoped_release release;
    zero::writeFileAtomic(path, s);
  });
  // A checkpoint file's contents held in memory, written later (asynchronous saves).
  py::class_<zero::ShardFile>(m, "CheckpointFile")
      .def(py::init([](const std::string& meta, const py::dict& blobs) {
        zero::ShardFile f;
        f.meta = meta;
        for (auto [k, v] : blobs) f.blobs[k.cast<std::string>()] = v.cast<std::string>();
        return f;
      }))
      .def_property_readonly("nbytes", [](const zero::ShardFile& f) {
        size_t n = f.meta.size();
        for (const auto& [k, v] : f.blobs) n += v.size();
        return n;
      })
      .def("write", [](const zero::ShardFile& f, const std::string& path) {
        py::gil_scoped_release release;
        f.write(path);
      });
  m.def("write_checkpoint_file", [](const std::string& path, const std::string& meta, const py::dict& blobs) {
    zero::ShardFile f;
    f.meta = meta;
    for (auto [k, v] : blobs) f.blobs[k.cast<std::string>()] = v.cast<std::string>();
    py::gil_scoped_release release;
    f.write(path);
  });
  m.def("read_checkpoint_file", [](const std::string& path) {
    zero::ShardFile f;
    {
      py::gil_scoped_release release;
      f = zero::ShardFile::read(path);
    }
    py::dict blobs;
    for (const auto& [k, v] : f.blobs) blobs[py::str(k)] = py::bytes(v);
    return py::make_tuple(f.meta, blobs);
  });

  py::class_<DeviceBlock>(m, "DeviceBlock")
      .def_readonly("device", &DeviceBlock::device)
      .def_readonly("nbytes", &DeviceBlock::bytes)
      .def_property_readonly("__cuda_array_interface__", [](const DeviceBlock& b) {
        py::dict d;
        d["shape"] = py::make_tuple(b.bytes);
        d["typestr"] = "|u1";
        d["data"] = py::make_tuple(b.ptr, false);
        d["version"] = 2;
        return d;
      });

  py::class_<Engine, std::shared_ptr<Engine>>(m, "ZeroEngine")
      .def(py::init([](const std::string& configJson, int32_t processSet, int dtype, const std::vector<size_t>& numels,
                       const std::vector<int>& groupOf, const std::string& optimizer, int32_t pipeSet,
                       const std::vector<double>& normWeights, const std::vector<int32_t>& priorities, int device,
                       uintptr_t stream, double gradFactor) {
             zero::EngineSpec spec;
             if (device >= 0) {  // the engine on this CUDA device, after the caller's stream
               spec.device = openCudaBackend();
               spec.ordinal = device;
               spec.stream = reinterpret_cast<void*>(stream);
             }
             spec.priorities = priorities;
             spec.gradFactor = gradFactor;
             spec.pipeProcessSet = pipeSet;
             spec.normWeights = normWeights;
             const int world = static_cast<int>(defaultRuntime().processSet(processSet).ranks().size());
             spec.config = zero::DsConfig::parse(configJson, world);
             spec.processSet = processSet;
             spec.dtype = static_cast<DataType>(dtype);
             spec.numels = numels;
             spec.groupOf = groupOf;
             static const std::map<std::string, zero::OptimKind> kKinds = {
                 {"adam", zero::OptimKind::kAdam},   {"adamw", zero::OptimKind::kAdamW},
                 {"sgd", zero::OptimKind::kSgd},     {"lion", zero::OptimKind::kLion},
                 {"adagrad", zero::OptimKind::kAdagrad}, {"lamb", zero::OptimKind::kLamb}};
             auto kind = kKinds.find(optimizer);
             if (kind == kKinds.end())
               throw InvalidArgument("ZeRO engine: optimizer '" + optimizer +
                                     "' is not adam, adamw, sgd, lion, adagrad or lamb");
             spec.optimizer = kind->second;
             return std::make_shared<Engine>(defaultRuntime(), std::move(spec));
           }),
           py::arg("config_json"), py::arg("process_set"), py::arg("dtype"), py::arg("numels"), py::arg("group_of"),
           py::arg("optimizer"), py::arg("pipe_set") = -1, py::arg("norm_weights") = std::vector<double>{},
           py::arg("priorities") = std::vector<int32_t>{}, py::arg("device") = -1, py::arg("stream") = 0,
           py::arg("grad_factor") = 1.0)
      .def_property_readonly("stage", &Engine::stage)
      .def_property_readonly("partition_elems", &Engine::partitionElems)
      .def_property_readonly("world", &Engine::world)
      .def_property_readonly("rank", &Engine::rank)
      .def_property_readonly("loss_scale", &Engine::lossScale)
      .def_property("loss_scaler_state", &Engine::lossScalerState, &Engine::setLossScalerState)
      .def_property("optimizer_steps", &Engine::optimizerSteps, &Engine::setOptimizerSteps)
      .def_property_readonly("placement", &Engine::placement)
      .def_property_readonly("live_bytes", &Engine::liveBytes)
      .def_property_readonly("writes_shard", &Engine::writesShard)
      .def_property_readonly("device", &Engine::device)
      .def("sync", [](Engine& e) {
        py::gil_scoped_release release;
        e.sync();
      })
      .def("param_storage", [](std::shared_ptr<Engine> e, size_t i) {
        void* p = e->paramStorage(i);
        const size_t bytes = e->plan().numel(i) * dtypeSize(e->dtype());
        return lendAny(*e, e, p, bytes);
      })
      .def("load_param", [](Engine& e, size_t i, uintptr_t src) { e.loadParam(i, reinterpret_cast<const void*>(src)); })
      .def("assign_param", [](Engine& e, size_t i, uintptr_t src) {
        py::gil_scoped_release release;
        e.assignParam(i, reinterpret_cast<const void*>(src));
      })
      .def("finish_init", [](Engine& e) {
        py::gil_scoped_release release;
        e.finishInit();
      })
      .def("grad_ready", [](Engine& e, size_t i, uintptr_t grad) {
        py::gil_scoped_release release;
        e.gradReady(i, reinterpret_cast<const void*>(grad));
      })
      .def("end_backward", [](Engine& e) {
        py::gil_scoped_release release;
        e.endBackward();
      })
      // total_sum_squares: the model's, when engines share one (grad_sum_squares of each, added up).
      .def("step", [](Engine& e, const py::list& groups, std::optional<double> total) {
        std::vector<zero::GroupHyper> hs;
        for (auto g : groups) hs.push_back(groupHyper(g.cast<py::dict>()));
        zero::StepResult r;
        {
          py::gil_scoped_release release;
          r = total ? e.step(hs, *total) : e.step(hs);
        }
        return py::make_tuple(r.skipped, r.gradNorm, r.lossScale);
      }, py::arg("groups"), py::arg("total_sum_squares") = std::nullopt)
      .def("step_external", [](Engine& e, std::optional<double> total) {
        zero::StepResult r;
        {
          py::gil_scoped_release release;
          r = total ? e.stepExternal(*total) : e.stepExternal();
        }
        return py::make_tuple(r.skipped, r.gradNorm, r.lossScale);
      }, py::arg("total_sum_squares") = std::nullopt)
      .def("prepare_external", [](Engine& e) {
        py::gil_scoped_release release;
        e.prepareExternal();
      })
      .def("finish_external", [](Engine& e, std::optional<double> total) {
        zero::StepResult r;
        {
          py::gil_scoped_release release;
          r = total ? e.finishExternal(*total) : e.finishExternal();
        }
        return py::make_tuple(r.skipped, r.gradNorm, r.lossScale);
      }, py::arg("total_sum_squares") = std::nullopt)
      // Each piece rank r holds: (parameter, offset in the parameter, partition offset, count).
      .def("pieces_of", [](const Engine& e, int r) {
        std::vector<std::tuple<size_t, size_t, size_t, size_t>> out;
        for (const auto& p : e.piecesOf(r)) out.emplace_back(p.param, p.paramOffset, p.partOffset, p.count);
        return out;
      })
      .def("external_set_sum_squares", [](Engine& e) {
        py::gil_scoped_release release;
        return e.externalSetSumSquares();
      })
      .def("grad_sum_squares", [](Engine& e) {
        py::gil_scoped_release release;
        return e.gradSumSquares();
      })
      .def("publish_external", [](Engine& e) {
        py::gil_scoped_release release;
        e.publishExternal();
      })
      // fp32 bytes (numpy: view as float32).
      // fp32 bytes of the optimizer's state k over the partition (an optimizer the caller steps keeps its moments there).
      .def("state_view", [](std::shared_ptr<Engine> e, int k) -> py::object {
        float* p = e->optimizerState(k);
        if (!p) return py::none();
        return lendAny(*e, e, p, e->partitionElems() * 4);
      })
      .def_property_readonly("state_on_disk", &Engine::stateOnDisk)
      // A copy of [offset, offset + count) of the master weights (k = -1) or state k, wherever they live.
      .def("read_state", [](const Engine& e, int k, size_t offset, size_t count) {
        if (k < -1 || k > 1 || offset + count > e.partitionElems())
          throw InvalidArgument("read_state: state " + std::to_string(k) + " [" + std::to_string(offset) + ", +" +
                                std::to_string(count) + ") is not within the partition");
        py::array_t<float> out(static_cast<py::ssize_t>(count));
        float* dst = out.mutable_data();
        {
          py::gil_scoped_release release;
          e.forState(offset, offset + count, false, [&](size_t off, size_t n, float* m, float* s1, float* s2) {
            const float* src = k == -1 ? m : k == 0 ? s1 : s2;
            if (!src) throw InvalidArgument("read_state: the optimizer has no state " + std::to_string(k));
            e.copyOut(dst + (off - offset), src, n * 4);
          });
        }
        return out;
      })
      .def("write_state", [](const Engine& e, int k, size_t offset, py::array_t<float, py::array::c_style | py::array::forcecast> values) {
        const size_t count = static_cast<size_t>(values.size());
        if (k < -1 || k > 1 || offset + count > e.partitionElems())
          throw InvalidArgument("write_state: state " + std::to_string(k) + " [" + std::to_string(offset) + ", +" +
                                std::to_string(count) + ") is not within the partition");
        const float* src = values.data();
        py::gil_scoped_release release;
        e.forState(offset, offset + count, true, [&](size_t off, size_t n, float* m, float* s1, float* s2) {
          float* dst = k == -1 ? m : k == 0 ? s1 : s2;
          if (!dst) throw InvalidArgument("write_state: the optimizer has no state " + std::to_string(k));
          e.copyIn(dst, src + (off - offset), n * 4);
        });
      })
      .def("master_view", [](std::shared_ptr<Engine> e) {
        return lendAny(*e, e, e->master(), e->partitionElems() * 4);
      })
      .def("external_grad_view", [](std::shared_ptr<Engine> e) {
        return lendAny(*e, e, e->externalGrad(), e->partitionElems() * 4);
      })
      .def("runs", &Engine::runs)
      // (parameter, partition offset, count) of each piece of a parameter this rank holds.
      .def("pieces", [](const Engine& e) {
        std::vector<std::tuple<size_t, size_t, size_t>> out;
        for (const auto& p : e.pieces()) out.emplace_back(p.param, p.partOffset, p.count);
        return out;
      })
      .def("gather_async", [](Engine& e, const std::vector<size_t>& params) {
        py::gil_scoped_release release;
        e.gatherAsync(params);
      })
      .def("gathered", [](Engine& e, size_t i) {
        std::shared_ptr<zero::Buffer> b;
        {
          py::gil_scoped_release release;
          b = e.gathered(i);
        }
        return lendAny(e, b, b->bytes(), e.plan().numel(i) * dtypeSize(e.dtype()));
      })
      .def("release", [](Engine& e, size_t i) {
        py::gil_scoped_release release;
        e.release(i);
      })
      .def("persistent", &Engine::persistent)
      .def("memory", [](const Engine& e) {
        const auto r = e.memory();
        py::dict d;
        d["params"] = r.params;
        d["grads"] = r.grads;
        d["optimizer"] = r.optimizer;
        d["fixed_buffers"] = r.fixedBuffers;
        d["disk"] = r.disk;
        d["psi"] = r.psi;
        return d;
      })
      .def("save_shard", [](const Engine& e, const std::string& path, const std::string& extra) {
        py::gil_scoped_release release;
        e.saveShard(path, extra);
      })
      .def("shard_snapshot_into", [](const Engine& e, zero::ShardFile& f, const std::string& extra) {
        py::gil_scoped_release release;
        e.shardSnapshotInto(f, extra);
      })
      .def("load_shards", [](Engine& e, const std::vector<std::string>& paths, const std::string& expected,
                              const std::vector<std::vector<int64_t>>& maps) {
        py::gil_scoped_release release;
        e.loadShards(paths, expected, maps);
      }, py::arg("paths"), py::arg("expected") = "", py::arg("param_maps") = std::vector<std::vector<int64_t>>{});
}
