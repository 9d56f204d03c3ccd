#include "zero/engine.h"

#include <algorithm>
#include <numeric>
#include <cmath>
#include <cstring>

#include "chorus/error.h"
#include "reduce/reduce.h"
#include "zero/optimizer_step.h"

namespace chorus::zero {

namespace {

LossScalerConfig scalerConfig(const DsConfig& c) {
  if (c.fp16.enabled) return c.fp16.scaler;
  LossScalerConfig off;
  off.dynamic = false;
  off.staticScale = 1.0;
  return off;
}

}  // namespace

Engine::Engine(Runtime& rt, EngineSpec spec)
    : rt_(rt), spec_(std::move(spec)), stage_(spec_.config.zero.stage), scaler_(scalerConfig(spec_.config)) {
  const ProcessSet ps = rt_.processSet(spec_.processSet);
  if (!ps.included())
    throw InvalidArgument("ZeRO engine: this rank is not in process set " + std::to_string(spec_.processSet));
  world_ = ps.size();
  rank_ = ps.rank();
  if (spec_.dtype != DataType::kFloat32 && spec_.dtype != DataType::kBFloat16 && spec_.dtype != DataType::kFloat16)
    throw InvalidArgument(std::string("ZeRO engine: parameters must be float32, bfloat16 or float16, not ") +
                          dtypeName(spec_.dtype));
  if (spec_.numels.empty()) throw InvalidArgument("ZeRO engine: the model has no trainable parameters");
  if (spec_.groupOf.empty()) spec_.groupOf.assign(spec_.numels.size(), 0);
  if (spec_.groupOf.size() != spec_.numels.size())
    throw InvalidArgument("ZeRO engine: groupOf has " + std::to_string(spec_.groupOf.size()) + " entries for " +
                          std::to_string(spec_.numels.size()) + " parameters");
  name_ = rt_.uniqueName(spec_.processSet, "zero") + ".";
  if (spec_.pipeProcessSet >= 0) {
    if (!rt_.processSet(spec_.pipeProcessSet).included())
      throw InvalidArgument("ZeRO engine: this rank is not in its pipeline's process set " +
                            std::to_string(spec_.pipeProcessSet));
    pipeName_ = rt_.uniqueName(spec_.pipeProcessSet, "zeropipe") + ".norm";
  }
  if (!spec_.priorities.empty() && spec_.priorities.size() != spec_.numels.size())
    throw InvalidArgument("ZeRO engine: " + std::to_string(spec_.priorities.size()) + " priorities for " +
                          std::to_string(spec_.numels.size()) + " parameters");
  if (!spec_.normWeights.empty() && (spec_.normWeights.size() != spec_.numels.size() || stage_ == 3))
    throw InvalidArgument("ZeRO engine: norm weights need one weight per parameter, and stage 0-2 (got " +
                          std::to_string(spec_.normWeights.size()) + " for " + std::to_string(spec_.numels.size()) +
                          " parameters at stage " + std::to_string(stage_) + ")");
  for (int g : spec_.groupOf) numGroups_ = std::max(numGroups_, static_cast<size_t>(g) + 1);
  commDtype_ = spec_.dtype;
  const std::string& comm = spec_.config.communicationDataType;
  if (comm == "fp32") commDtype_ = DataType::kFloat32;
  if (comm == "fp16") commDtype_ = DataType::kFloat16;
  if (comm == "bf16") commDtype_ = DataType::kBFloat16;
  mem_ = spec_.device ? deviceMemory(spec_.device, spec_.ordinal, spec_.stream, spec_.offloadChunkElems)
                      : hostMemory();

  const auto& z = spec_.config.zero;
  const size_t bucket = static_cast<size_t>(std::max<int64_t>(z.reduceBucketSize, 1));
  plan_ = std::make_unique<PartitionPlan>(spec_.numels, stage_ == 0 ? 1 : world_,
                                          stage_ == 3 ? Layout::kPerParam : Layout::kContiguous, bucket);
  pieces_ = plan_->pieces(stage_ == 0 ? 0 : rank_);
  const size_t part = plan_->partitionElems(), es = esize();
  const bool pinOpt = z.offloadOptimizer == "cpu" && z.pinMemory;

  if (stage_ < 3) {
    size_t total = 0;
    for (const auto& u : plan_->units()) {
      unitBase_.push_back(total);
      total += u.flatElems();
    }
    // The allgather after each step writes every rank's slices straight into it;
    // the gradients' reduction reads every rank's straight from theirs.
    params_ = mem_->collective(total * es);
    if (stage_ < 2) grads_ = mem_->collective(total * es);
  } else if (z.offloadParam == "nvme" && part > static_cast<size_t>(z.paramMaxInCpu)) {
    NvmeConfig pc;  // (a partition within max_in_cpu stays in host memory, as offload_param "cpu")
    pc.path = z.paramNvmePath;
    pc.elemBytes = es;
    pc.chunkElems = std::min<size_t>(static_cast<size_t>(z.paramBufferSize), std::max<size_t>(part, 1));
    pc.blockBytes = static_cast<size_t>(spec_.config.aioBlockSize);
    pc.queueDepth = static_cast<unsigned>(spec_.config.aioQueueDepth);
    paramSwap_ = std::make_unique<NvmeSwap>(pc, "rank" + std::to_string(rt_.rank()) + "-params", part, 1);
  } else {
    const bool offParam = z.offloadParam == "cpu" || z.offloadParam == "nvme";
    // (a device's slices are pinned with offload_param's pin_memory; the host's as before, with the optimizer's)
    paramPart_ = mem_->state(part * es, offParam, offParam && (spec_.device ? z.pinMemory : pinOpt));
  }
  // An fp32 model's master weights are its parameters (stages 0 and 3) where both
  // live in the same memory; on a device, offloading one and not the other parts them.
  const bool nvme = z.offloadOptimizer == "nvme";
  const bool offOpt = z.offloadOptimizer == "cpu" || nvme;
  const bool paramsOffloaded = stage_ == 3 && (z.offloadParam == "cpu" || z.offloadParam == "nvme");
  masterIsParams_ = spec_.dtype == DataType::kFloat32 && (stage_ == 0 || stage_ == 3) &&
                    (!spec_.device || offOpt == paramsOffloaded) && !paramSwap_;
  if (nvme) {
    NvmeConfig nc;
    nc.path = z.optimizerNvmePath;
    nc.chunkElems = std::min<size_t>(static_cast<size_t>(z.subGroupSize), std::max<size_t>(part, 1));
    nc.pipelineRead = z.pipelineRead;
    nc.pipelineWrite = z.pipelineWrite;
    nc.blockBytes = static_cast<size_t>(spec_.config.aioBlockSize);
    nc.queueDepth = static_cast<unsigned>(spec_.config.aioQueueDepth);
    const int arrays = (masterIsParams_ ? 0 : 1) + (stateCount(spec_.optimizer) == 2 ? 2 : 1);
    swap_ = std::make_unique<NvmeSwap>(nc, "rank" + std::to_string(rt_.rank()), part, arrays);
    host_ = hostMemory();
    if (stage_ == 3 && !spec_.device) {
      NvmeConfig gc = nc;
      gc.elemBytes = es;
      // (a tile of the state at any alignment in one chunk of gradients)
      gc.chunkElems = nc.chunkElems + 2 * 4096 / es;
      gradSwap_ = std::make_unique<NvmeSwap>(gc, "rank" + std::to_string(rt_.rank()) + "-grads", part, 1);
      gradFresh_.assign(plan_->units().size(), true);
    }
  } else {
    if (!masterIsParams_) master_ = mem_->state(part * 4, offOpt, pinOpt);
    state1_ = mem_->state(part * 4, offOpt, pinOpt);
    if (stateCount(spec_.optimizer) == 2) state2_ = mem_->state(part * 4, offOpt, pinOpt);
  }

  // Runs of the partition that share an optimizer group; padding joins the run before it.
  for (size_t u = 0; u < plan_->units().size(); ++u) {
    const Unit& unit = plan_->units()[u];
    size_t runStart = 0;
    int group = -1;
    for (const auto& p : pieces_) {
      if (p.partOffset < unit.partOffset || p.partOffset >= unit.partOffset + unit.slice) continue;
      const int g = spec_.groupOf[p.param];
      if (group == -1) {
        group = g;
      } else if (g != group) {
        const size_t at = p.partOffset - unit.partOffset;
        runs_.push_back({u, runStart, at - runStart, group});
        runStart = at;
        group = g;
      }
    }
    runs_.push_back({u, runStart, unit.slice - runStart, std::max(group, 0)});
  }

  unitMissing_.resize(plan_->units().size());
  unitBucket_.assign(plan_->units().size(), -1);
  unitLaunched_.assign(plan_->units().size(), false);
  resetMissing();
  persistent_.assign(spec_.numels.size(), false);
  if (stage_ >= 2 && !gradSwap_) gradPart_ = mem_->scratch(part * es);
  if (stage_ == 3)
    for (size_t i = 0; i < spec_.numels.size(); ++i)
      persistent_[i] = static_cast<int64_t>(spec_.numels[i]) < z.paramPersistenceThreshold;
  placement_ = std::string(spec_.device ? "cuda:" + std::to_string(spec_.ordinal) : "cpu") + " (" +
               (nvme ? "optimizer offloaded to " + z.optimizerNvmePath + (swap_->direct() ? ", direct I/O" : ", buffered I/O")
                     : z.offloadOptimizer == "cpu" ? "optimizer offloaded" : "optimizer in place") +
               (pinOpt ? (state1_.pinned() ? ", pinned" : ", pinning refused by RLIMIT_MEMLOCK") : "") + ")";
}

Engine::~Engine() {
  // Ops in flight write into our buffers: let them finish (errors are moot now),
  // on the host and then on the device.
  auto finish = [&](std::unique_ptr<Work>& w) {
    if (!w) return;
    try {
      if (w->waitFor(std::chrono::milliseconds(60000))) mem_->await(*w);
    } catch (...) {
    }
  };
  for (auto& b : pool_) finish(b.work);
  for (auto& [i, g] : live_) finish(g.work);
  try {
    mem_->sync();
  } catch (...) {
  }
}

std::string Engine::name(const char* what, size_t id) const { return name_ + what + "." + std::to_string(id); }

int32_t Engine::unitPriority(size_t u) const {
  if (spec_.priorities.empty()) return 0;
  int32_t best = INT32_MIN;
  for (size_t param : plan_->units()[u].params) best = std::max(best, spec_.priorities[param]);
  return best;
}

void Engine::resetMissing() {
  for (size_t u = 0; u < plan_->units().size(); ++u) {
    unitMissing_[u] = plan_->units()[u].params.size();
    unitLaunched_[u] = false;
  }
}

float* Engine::masterPtr() const {
  if (!masterIsParams_) return master_.as<float>();
  return stage_ == 0 ? params_.as<float>() : paramPart_.as<float>();
}

char* Engine::gradSlice(size_t u) const {
  const Unit& unit = plan_->units()[u];
  if (stage_ == 0) return grads_.bytes() + unitBase_[u] * esize();
  if (stage_ == 1) return grads_.bytes() + (unitBase_[u] + rank_ * unit.slice) * esize();
  return gradPart_.bytes() + unit.partOffset * esize();
}

char* Engine::paramSlice(size_t u) const {
  const Unit& unit = plan_->units()[u];
  if (stage_ == 3) return paramPart_.bytes() + unit.partOffset * esize();
  return params_.bytes() + (unitBase_[u] + (stage_ == 0 ? 0 : rank_) * unit.slice) * esize();
}

void* Engine::paramStorage(size_t i) {
  if (stage_ == 3) throw InvalidArgument("ZeRO engine: stage 3 parameters have no full storage; gather them");
  const size_t u = plan_->unitOf(i);
  return unitParams(u) + plan_->units()[u].offsets[plan_->indexInUnit(i)] * esize();
}

void Engine::loadParam(size_t i, const void* src) {
  const size_t n = spec_.numels.at(i), es = esize();
  if (stage_ < 3) {
    mem_->copy(paramStorage(i), src, n * es);
    return;
  }
  // Stage 3 keeps only slices: take the set's first rank's value now.
  Buffer full = mem_->scratch(n * es);
  mem_->copy(full.bytes(), src, n * es);
  OpOptions o;
  o.name = name("init", i);
  Work w = rt_.broadcastAsync(tensor(full.bytes(), n), tensor(full.bytes(), n),
                              rt_.processSet(spec_.processSet).ranks()[0], on(o));
  w.wait();
  mem_->await(w);
  const size_t u = plan_->unitOf(i), j = plan_->indexInUnit(i);
  const size_t s = plan_->units()[u].slices[j], begin = std::min(n, rank_ * s), end = std::min(n, (rank_ + 1) * s);
  sliceWrite(plan_->units()[u].partOffset + plan_->units()[u].offsets[j], full.bytes() + begin * es, end - begin);
  mem_->retire(std::make_shared<Buffer>(std::move(full)));
}

void Engine::assignParam(size_t i, const void* src) {
  const size_t n = spec_.numels.at(i), es = esize();
  const size_t u = plan_->unitOf(i), j = plan_->indexInUnit(i);
  const Unit& unit = plan_->units()[u];
  // [begin, end) of the parameter that this rank's slice holds, and where in the slice.
  size_t begin = 0, end = n, at = 0;
  if (stage_ == 3) {
    const size_t s = unit.slices[j];
    begin = std::min(n, rank_ * s);
    end = std::min(n, (rank_ + 1) * s);
    at = unit.offsets[j];
  } else {
    mem_->copy(paramStorage(i), src, n * es);
    const size_t lo = stage_ == 0 ? 0 : rank_ * unit.slice, hi = lo + unit.slice;
    const size_t first = unit.offsets[j], a = std::max(first, lo), b = std::min(first + n, hi);
    begin = end = 0;
    if (b > a) {
      begin = a - first;
      end = b - first;
      at = a - lo;
    }
  }
  if (end <= begin) {
    if (stage_ == 3) regatherLive();
    return;
  }
  const char* from = static_cast<const char*>(src) + begin * es;
  if (stage_ == 3) sliceWrite(unit.partOffset + at, from, end - begin);
  if (!masterIsParams_) {
    // (from the slice at stage 3: src may be host memory and the master on the device; from
    // src itself when the slices are on disk)
    const char* from16 = paramSwap_ ? from
                         : stage_ == 3 ? paramSlice(u) + at * es
                                       : static_cast<char*>(paramStorage(i)) + begin * es;
    const size_t b = unit.partOffset + at;
    forState(b, b + (end - begin), true, [&](size_t off, size_t n, float* m, float*, float*) {
      paramsToMaster(m, from16 + (off - b) * es, n);
    });
  }
  if (stage_ == 3) regatherLive();
}

void Engine::finishInit() {
  if (stage_ < 3) {
    std::vector<Work> works;
    const int root = rt_.processSet(spec_.processSet).ranks()[0];
    for (size_t u = 0; u < plan_->units().size(); ++u) {
      OpOptions o;
      o.name = name("bcast", u);
      Tensor t = tensor(unitParams(u), plan_->units()[u].flatElems());
      works.push_back(rt_.broadcastAsync(t, t, root, on(o)));
    }
    for (auto& w : works) {
      w.wait();
      mem_->await(w);
    }
  }
  if (!masterIsParams_)
    forState(0, plan_->partitionElems(), true, [&](size_t off, size_t n, float* m, float*, float*) {
      for (size_t u = 0; u < plan_->units().size(); ++u) {
        const Unit& unit = plan_->units()[u];
        const size_t lo = std::max(off, unit.partOffset), hi = std::min(off + n, unit.partOffset + unit.slice);
        if (lo >= hi) continue;
        if (paramSwap_) {
          std::vector<char> slice((hi - lo) * esize());
          sliceRead(lo, slice.data(), hi - lo);
          host_->toFloat(m + (lo - off), slice.data(), spec_.dtype, hi - lo);
        } else {
          paramsToMaster(m + (lo - off), paramSlice(u) + (lo - unit.partOffset) * esize(), hi - lo);
        }
      }
    });
  regatherLive();
}

void Engine::gradReady(size_t i, const void* grad) {
  const size_t u = plan_->unitOf(i), j = plan_->indexInUnit(i), n = spec_.numels.at(i), es = esize();
  const Unit& unit = plan_->units()[u];
  if (stage_ < 2) {
    mem_->accumulate(spec_.dtype, unitGrads(u) + unit.offsets[j] * es, grad, n);
    return;
  }
  if (unitLaunched_[u])
    throw InvalidArgument("ZeRO engine: parameter " + std::to_string(i) +
                          " got a second gradient in one backward after its bucket was reduced");
  Bucket& b = pool_[acquireBucket(u)];
  if (stage_ == 2) {
    mem_->copy(b.data.bytes() + unit.offsets[j] * es, grad, n * es);
  } else {
    const size_t s = unit.slices[j];
    for (size_t r = 0; r < static_cast<size_t>(world_); ++r) {
      const size_t begin = std::min(n, r * s), end = std::min(n, (r + 1) * s);
      if (end > begin)
        mem_->copy(b.data.bytes() + (r * unit.slice + unit.offsets[j]) * es,
                   static_cast<const char*>(grad) + begin * es, (end - begin) * es);
    }
  }
  if (--unitMissing_[u] == 0) launchUnit(u);
}

int Engine::acquireBucket(size_t u) {
  if (unitBucket_[u] >= 0) return unitBucket_[u];
  // At most two buckets reduce while backward goes on; more would only add memory.
  while (inFlight_.size() >= 2) completeOldest();
  int free = -1;
  for (size_t k = 0; k < pool_.size(); ++k)
    if (pool_[k].unit == SIZE_MAX) free = static_cast<int>(k);
  if (free < 0) {
    pool_.push_back(Bucket{mem_->collective(plan_->maxUnitFlatElems() * esize()), SIZE_MAX, 0, nullptr});
    free = static_cast<int>(pool_.size() - 1);
  }
  Bucket& b = pool_[free];
  mem_->zero(b.data.bytes(), plan_->units()[u].flatElems() * esize());
  b.unit = u;
  unitBucket_[u] = free;
  return free;
}

void Engine::launchUnit(size_t u) {
  const int k = acquireBucket(u);
  Bucket& b = pool_[k];
  ReducescatterOptions o;
  o.name = name("rs", u);
  o.priority = unitPriority(u);
  o.op = ReduceOp::kAverage;
  const size_t n = plan_->units()[u].flatElems();
  Tensor in = tensor(b.data.bytes(), n);
  if (recast()) {
    if (b.comm.size() < plan_->maxUnitFlatElems() * commEsize())
      b.comm = mem_->collective(plan_->maxUnitFlatElems() * commEsize());
    convert(b.comm.bytes(), commDtype_, b.data.bytes(), spec_.dtype, n);
    in = tensor(b.comm.bytes(), n, commDtype_);
  }
  b.work = std::make_unique<Work>(rt_.reducescatterAsync(in, on(o)));
  unitLaunched_[u] = true;
  inFlight_.push_back(k);
}

void Engine::completeOldest() {
  const int k = inFlight_.front();
  inFlight_.pop_front();
  Bucket& b = pool_[k];
  const size_t u = b.unit;
  b.unit = SIZE_MAX;
  unitBucket_[u] = -1;
  std::unique_ptr<Work> work = std::move(b.work);
  work->wait();
  mem_->await(*work);
  const size_t slice = plan_->units()[u].slice;
  const void* reduced = work->output(0).data;
  if (recast()) {
    if (recvScratch_.size() < slice * esize()) recvScratch_ = mem_->scratch(plan_->maxUnitFlatElems() * esize());
    convert(recvScratch_.bytes(), spec_.dtype, reduced, commDtype_, slice);
    reduced = recvScratch_.bytes();
  }
  addReduced(u, reduced, slice);
  mem_->retire(std::shared_ptr<Work>(std::move(work)));  // (its output is read until then)
}

void Engine::endBackward() {
  if (stage_ < 2) return;
  // Every unit is reduced every micro-batch, also one whose gradients never came
  // on this rank (unused parameters): peers may have them.
  for (size_t u = 0; u < plan_->units().size(); ++u)
    if (!unitLaunched_[u]) launchUnit(u);
  while (!inFlight_.empty()) completeOldest();
  resetMissing();
}

void Engine::reduceAtBoundary() {
  std::vector<std::pair<size_t, Work>> works;
  // Higher priorities submitted first: they are not left waiting behind a cycle
  // that took the first units before the rest were ready.
  std::vector<size_t> order(plan_->units().size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return unitPriority(a) > unitPriority(b); });
  for (size_t u : order) {
    const Unit& unit = plan_->units()[u];
    Tensor t = tensor(unitGrads(u), unit.flatElems());
    if (recast()) {
      if (!commGrads_.size()) commGrads_ = mem_->collective(grads_.size() / esize() * commEsize());
      char* c = commGrads_.bytes() + unitBase_[u] * commEsize();
      convert(c, commDtype_, unitGrads(u), spec_.dtype, unit.flatElems());
      t = tensor(c, unit.flatElems(), commDtype_);
    }
    if (stage_ == 0) {
      AllreduceOptions o;
      o.name = name("ar", u);
      o.priority = unitPriority(u);
      o.op = ReduceOp::kAverage;
      works.emplace_back(u, rt_.allreduceAsync(t, t, on(o)));
    } else {
      ReducescatterOptions o;
      o.name = name("rs", u);
      o.priority = unitPriority(u);
      o.op = ReduceOp::kAverage;
      works.emplace_back(u, rt_.reducescatterAsync(t, on(o)));
    }
  }
  for (auto& [u, w] : works) {
    w.wait();
    mem_->await(w);
    const size_t n = stage_ == 0 ? plan_->units()[u].flatElems() : plan_->units()[u].slice;
    char* dst = stage_ == 0 ? unitGrads(u) : gradSlice(u);
    if (recast())
      convert(dst, spec_.dtype, w.output(0).data, commDtype_, n);
    else if (stage_ == 1)
      mem_->copy(dst, w.output(0).data, n * esize());
    mem_->retire(std::make_shared<Work>(std::move(w)));  // (its output is read until then)
  }
}

void Engine::finishReductions() {
  if (stage_ < 2) {
    reduceAtBoundary();
  } else if (!inFlight_.empty() || std::find(unitLaunched_.begin(), unitLaunched_.end(), true) != unitLaunched_.end() ||
             std::find_if(unitBucket_.begin(), unitBucket_.end(), [](int b) { return b >= 0; }) != unitBucket_.end()) {
    endBackward();  // the caller did not: finish this backward's buckets
  }
}

void Engine::sumOver(double* v, size_t n, int32_t set, const std::string& op) {
  AllreduceOptions o;
  o.name = op;
  o.processSet = set;
  o.op = ReduceOp::kSum;
  Tensor t{v, DataType::kFloat64, {static_cast<int64_t>(n)}};
  rt_.allreduce(t, t, o);
}

double Engine::setSumSquares(double sumsq) {
  if (stage_ > 0) sumOver(&sumsq, 1, spec_.processSet, name("norm", 0));
  // this stage's share, summed over the stages
  if (spec_.pipeProcessSet >= 0) sumOver(&sumsq, 1, spec_.pipeProcessSet, pipeName_);
  return sumsq;
}

double Engine::gradSumSquares() {
  finishReductions();
  double local = 0.0;
  if (gradSwap_)
    onDisk([&] { local = diskSumSquares(); });  // (a failed gradient write or read fails every rank)
  else
    local = localSumSquares();
  return setSumSquares(local) * spec_.gradFactor * spec_.gradFactor;
}

StepResult Engine::prepareStep(float* gradScale, const double* totalSumSquares) {
  return decide(totalSumSquares ? *totalSumSquares : gradSumSquares(), false, gradScale);
}

StepResult Engine::decide(double sumsq, bool unscaled, float* gradScale) {
  StepResult res;
  res.lossScale = scaler_.scale();
  const bool fp16 = spec_.config.fp16.enabled;
  const double clip = spec_.config.gradientClipping;
  // A non-finite norm on any rank shows in the summed norm, so every rank skips together.
  // DeepSpeed 0.19.8 skips such a step under fp16, with bf16 (at ZeRO stages unless
  // bf16.check_grad_overflow is false) and at fp32 ZeRO stages; its plain fp32 optimizer does not.
  const bool bf16 = spec_.config.bf16;
  const bool checks = fp16 || (bf16 ? (stage_ == 0 || spec_.config.bf16CheckOverflow) : stage_ > 0);
  const bool overflow = checks && !std::isfinite(sumsq);
  res.skipped = scaler_.update(overflow);
  if (res.skipped) {
    zeroGrads();
    return res;
  }
  // Always: DeepSpeed's get_global_grad_norm() reports it whether or not it clips.
  res.gradNorm = unscaled ? std::sqrt(sumsq) : std::sqrt(sumsq) / res.lossScale;
  *gradScale = unscaled ? 1.0f : static_cast<float>(spec_.gradFactor / res.lossScale);
  if (clip > 0.0 && res.gradNorm > clip) *gradScale *= static_cast<float>(clip / (res.gradNorm + 1e-6));
  ++optSteps_;
  return res;
}

double Engine::localSumSquares() const {
  if (spec_.normWeights.empty()) {  // (one read of the device's sum)
    mem_->normBegin();
    for (size_t u = 0; u < plan_->units().size(); ++u)
      mem_->normAdd(gradSlice(u), spec_.dtype, plan_->units()[u].slice);
    return mem_->normEnd();
  }
  double sumsq = 0.0;
  for (size_t u = 0; u < plan_->units().size(); ++u) {
    const Unit& unit = plan_->units()[u];
    // kContiguous: the slice is [lo, lo + slice) of the unit's flat buffer.
    const size_t lo = stage_ == 0 ? 0 : static_cast<size_t>(rank_) * unit.slice, hi = lo + unit.slice;
    const char* base = gradSlice(u);
    for (size_t k = 0; k < unit.params.size(); ++k) {
      const size_t param = unit.params[k];
      const size_t a = std::max(lo, unit.offsets[k]), b = std::min(hi, unit.offsets[k] + plan_->numel(param));
      if (a < b) sumsq += spec_.normWeights[param] * mem_->sumSquares(base + (a - lo) * esize(), spec_.dtype, b - a);
    }
  }
  return sumsq;
}

StepResult Engine::step(const std::vector<GroupHyper>& groups) { return stepWith(groups, nullptr); }

StepResult Engine::step(const std::vector<GroupHyper>& groups, double totalSumSquares) {
  return stepWith(groups, &totalSumSquares);
}

StepResult Engine::stepExternal() { return stepExternalWith(nullptr); }

StepResult Engine::stepExternal(double totalSumSquares) { return stepExternalWith(&totalSumSquares); }

StepResult Engine::stepWith(const std::vector<GroupHyper>& groups, const double* totalSumSquares) {
  if (groups.size() < numGroups_)
    throw InvalidArgument("ZeRO engine: step got " + std::to_string(groups.size()) + " parameter groups, the model has " +
                          std::to_string(numGroups_));
  if (stateBroken_)
    throw Error("ZeRO engine: a read or write of the state on disk failed in an earlier step, leaving it partly "
                "stepped; load a checkpoint into a new engine");
  float gradScale = 1.0f;
  StepResult res = prepareStep(&gradScale, totalSumSquares);
  if (res.skipped) return res;
  if (spec_.optimizer == OptimKind::kLamb) {
    lambStep(groups, gradScale);
    publishParams();
    zeroGrads();
    return res;
  }
  onDisk([&] {
    writeFreshGrads();
    forState(0, plan_->partitionElems(), true, [&](size_t off, size_t n, float* m, float* s1, float* s2) {
      withGradTile(off, n, [&] {
        for (const auto& run : runs_) {
          const size_t at = plan_->units()[run.unit].partOffset + run.offset, es = esize();
          const size_t lo = std::max(at, off), hi = std::min(at + run.length, off + n);
          if (lo >= hi) continue;
          const size_t in = run.offset + (lo - at), d = lo - off;
          RunArgs a{m + d,
                    s1 + d,
                    s2 ? s2 + d : nullptr,
                    gradAt(run.unit, in),
                    masterIsParams_ || paramSwap_ ? nullptr : paramSlice(run.unit) + in * es,
                    spec_.dtype,
                    hi - lo,
                    gradScale,
                    optSteps_};
          mem_->optimizer(spec_.optimizer, groups[run.group], a);
        }
      });
      roundBf16(m, s1, s2, n);
      if (swap_) mem_->sync();  // (the tile goes back to disk next)
      if (paramSwap_) masterToSlices(m, off, n);
    });
  });
  publishParams();
  zeroGrads();
  return res;
}

void Engine::convert(void* dst, DataType to, const void* src, DataType from, size_t n) {
  if (from == DataType::kFloat32) {
    mem_->fromFloat(dst, static_cast<const float*>(src), to, n);
  } else if (to == DataType::kFloat32) {
    mem_->toFloat(static_cast<float*>(dst), src, from, n);
  } else {  // bf16 <-> fp16: through fp32
    if (convScratch_.size() < n * 4) convScratch_ = mem_->scratch(n * 4);
    mem_->toFloat(convScratch_.as<float>(), src, from, n);
    mem_->fromFloat(dst, convScratch_.as<float>(), to, n);
  }
}

void Engine::keepBf16Precision() {
  forState(0, plan_->partitionElems(), true,
           [&](size_t, size_t n, float* m, float* s1, float* s2) { roundBf16(m, s1, s2, n); });
}

void Engine::lambStep(const std::vector<GroupHyper>& groups, float gradScale) {
  // Each parameter's trust ratio is over the whole parameter: the squared norms
  // of this rank's pieces are summed over the set first.
  std::vector<double> sums(2 * numParams(), 0.0);
  const size_t part = plan_->partitionElems();
  onDisk([&] {
    writeFreshGrads();
    forState(0, part, true, [&](size_t off, size_t n, float* m, float* s1, float* s2) {
      withGradTile(off, n, [&] {
        forPieces(off, n, m, s1, s2, gradScale, [&](const Piece& p, const RunArgs& a) {
          mem_->lambMoments(groups[spec_.groupOf[p.param]], a, &sums[2 * p.param], &sums[2 * p.param + 1]);
        });
      });
      if (swap_) mem_->sync();
    });
  });
  if (stage_ > 0 && world_ > 1) sumOver(sums.data(), sums.size(), spec_.processSet, name("lamb", 0));
  onDisk([&] {
    forState(0, part, true, [&](size_t off, size_t n, float* m, float* s1, float* s2) {
      withGradTile(off, n, [&] {
        forPieces(off, n, m, s1, s2, gradScale, [&](const Piece& p, const RunArgs& a) {
          const GroupHyper& h = groups[spec_.groupOf[p.param]];
          mem_->lambApply(h, a, lambTrust(lambCoefficients(h, gradScale, optSteps_), sums[2 * p.param],
                                          sums[2 * p.param + 1]));
        });
      });
      roundBf16(m, s1, s2, n);
      if (swap_) mem_->sync();
      if (paramSwap_) masterToSlices(m, off, n);
    });
  });
}

StepResult Engine::stepExternalWith(const double* totalSumSquares) {
  requireStateInMemory("an optimizer stepped outside the engine");
  float gradScale = 1.0f;
  StepResult res = prepareStep(&gradScale, totalSumSquares);
  if (res.skipped) return res;
  float* grads = externalGrad();
  for (size_t u = 0; u < plan_->units().size(); ++u) {
    const Unit& unit = plan_->units()[u];
    float* dst = grads + unit.partOffset;
    mem_->toFloat(dst, gradSlice(u), spec_.dtype, unit.slice);
    mem_->scale(dst, unit.slice, gradScale);
  }
  mem_->sync();  // (the caller's optimizer reads them next)
  return res;
}

void Engine::prepareExternal() {
  requireStateInMemory("an optimizer stepped outside the engine");
  finishReductions();
  float* grads = externalGrad();
  const float unscale = static_cast<float>(spec_.gradFactor / scaler_.scale());
  for (size_t u = 0; u < plan_->units().size(); ++u) {
    const Unit& unit = plan_->units()[u];
    mem_->toFloat(grads + unit.partOffset, gradSlice(u), spec_.dtype, unit.slice);
    mem_->scale(grads + unit.partOffset, unit.slice, unscale);
  }
  mem_->sync();  // (the caller reads them next)
}

double Engine::externalSumSquares() {
  const float* g = externalGrad();
  if (spec_.normWeights.empty()) {
    mem_->normBegin();
    mem_->normAdd(g, DataType::kFloat32, plan_->partitionElems());
    return mem_->normEnd();
  }
  double sumsq = 0.0;
  for (const auto& p : pieces_)
    sumsq += spec_.normWeights[p.param] * mem_->sumSquares(g + p.partOffset, DataType::kFloat32, p.count);
  return sumsq;
}

StepResult Engine::finishExternal() { return finishExternalWith(nullptr); }

StepResult Engine::finishExternal(double totalSumSquares) { return finishExternalWith(&totalSumSquares); }

StepResult Engine::finishExternalWith(const double* totalSumSquares) {
  float clipScale = 1.0f;
  StepResult res = decide(totalSumSquares ? *totalSumSquares : setSumSquares(externalSumSquares()), true, &clipScale);
  if (res.skipped) return res;
  if (clipScale != 1.0f) mem_->scale(externalGrad(), plan_->partitionElems(), clipScale);
  mem_->sync();
  return res;
}

void Engine::publishExternal() {
  requireStateInMemory("an optimizer stepped outside the engine");
  keepBf16Precision();
  if (!masterIsParams_)
    for (size_t u = 0; u < plan_->units().size(); ++u)
      mem_->fromFloat(paramSlice(u), master_.as<float>() + plan_->units()[u].partOffset, spec_.dtype,
                      plan_->units()[u].slice);
  publishParams();
  zeroGrads();
}

float* Engine::externalGrad() {
  // Beside the master weights: where the caller's optimizer runs on them.
  requireStateInMemory("an optimizer stepped outside the engine");
  if (!externalGrad_.size())
    externalGrad_ = mem_->state(plan_->partitionElems() * 4, spec_.config.zero.offloadOptimizer == "cpu", false);
  return externalGrad_.as<float>();
}

void Engine::zeroGrads() {
  mem_->zero(grads_.bytes(), grads_.size());
  mem_->zero(gradPart_.bytes(), gradPart_.size());
  gradFresh_.assign(gradFresh_.size(), true);
}

std::vector<std::tuple<size_t, size_t, int>> Engine::runs() const {
  std::vector<std::tuple<size_t, size_t, int>> out;
  for (const auto& r : runs_) out.emplace_back(plan_->units()[r.unit].partOffset + r.offset, r.length, r.group);
  return out;
}

void Engine::publishParams() {
  if (stage_ == 3) {
    regatherLive();
    return;
  }
  if (stage_ == 0) return;
  // Allgather each unit's slices straight into the module's storage; the input is
  // a copy of this rank's slice so that it never aliases the output.
  size_t largest = 0;
  for (const auto& unit : plan_->units()) largest = std::max(largest, unit.slice * esize());
  for (auto& b : agIn_)
    if (b.size() < largest) b = mem_->scratch(largest);
  std::deque<Work> flying;  // unit u's input is agIn_[u % 2]
  for (size_t u = 0; u < plan_->units().size(); ++u) {
    const Unit& unit = plan_->units()[u];
    if (flying.size() >= 2) {
      flying.front().wait();
      mem_->await(flying.front());
      flying.pop_front();
    }
    char* in = agIn_[u % 2].bytes();
    mem_->copy(in, paramSlice(u), unit.slice * esize());
    OpOptions o;
    o.name = name("ag", u);
    char* out = unitParams(u);
    flying.push_back(rt_.allgatherAsync(tensor(in, unit.slice), on(o),
                                        [out](const Shape&, DataType) -> void* { return out; }));
  }
  for (auto& w : flying) {
    w.wait();
    mem_->await(w);
  }
}

MemoryReport Engine::memory() const {
  MemoryReport m;
  for (size_t n : spec_.numels) m.psi += n;
  m.params = params_.size() + paramPart_.size();
  m.grads = grads_.size() + gradPart_.size();
  m.optimizer = master_.size() + state1_.size() + state2_.size();
  m.fixedBuffers = agIn_[0].size() + agIn_[1].size() + liveBytes_;
  for (const NvmeSwap* s : {swap_.get(), paramSwap_.get(), gradSwap_.get()})
    if (s) {
      m.fixedBuffers += s->bufferBytes();
      m.disk += s->diskBytes();
    }
  for (const auto& b : pool_) m.fixedBuffers += b.data.size();
  return m;
}

}  // namespace chorus::zero
