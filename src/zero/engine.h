#pragma once
// The ZeRO engine: owns the flat, partitioned training state of one model on one
// rank and runs ZeRO's collectives through chorus's runtime. The Python layer only
// hooks it into torch modules and autograd.
//
// Buffers (elements of the model dtype unless noted), per stage:
//   params_   full parameters, one flat buffer per unit     stages 0-2 (the module's storage)
//   paramPart_ the rank's slices of the parameters           stage 3
//   grads_    full gradients, accumulated locally             stages 0-1
//   gradPart_ the rank's reduced gradient slices              stages 2-3 (stage 3, nvme, host: a file)
//   master_/state fp32 master weights and optimizer state, the rank's partition
//             (stage 0: everything; an fp32 model's master is its parameters at stages 0 and 3)
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "chorus/runtime.h"
#include "zero/buffer.h"
#include "zero/ds_config.h"
#include "zero/hyper.h"
#include "zero/loss_scaler.h"
#include "zero/shard_file.h"
#include "zero/memory.h"
#include "zero/nvme_swap.h"
#include "zero/partition.h"

namespace chorus::zero {

struct StepResult {
  bool skipped = false;   // overflow: no update on any rank
  double gradNorm = 0.0;  // global norm of the unscaled gradients
  double lossScale = 1.0; // the scale used for this step's gradients
};

// Bytes of model states this rank holds, and the fixed buffers beside them.
struct MemoryReport {
  size_t params = 0, grads = 0, optimizer = 0, fixedBuffers = 0, psi = 0;
  size_t disk = 0;  // the optimizer's state offloaded to nvme_path
};

struct EngineSpec {
  DsConfig config;
  int32_t processSet = kGlobalProcessSetId;
  DataType dtype = DataType::kFloat32;  // the module's dtype: float32, bfloat16 or float16
  std::vector<size_t> numels;           // the trainable parameters, in module order
  std::vector<int> groupOf;             // optimizer group of each parameter
  OptimKind optimizer = OptimKind::kAdam;
  // Pipeline parallelism: the ranks holding the other stages of this replica
  // (one per stage). The gradient norm, and so clipping and the loss scaler's
  // overflow, is taken over the whole model, so that every stage agrees. -1: none.
  int32_t pipeProcessSet = -1;
  // With pipeProcessSet: each parameter's share of the norm (1/k for a parameter
  // that k ranks of that set hold alike, as a tensor-parallel layer's bias). Empty: all 1.
  std::vector<double> normWeights;
  // The device the engine keeps its buffers on and works on (null: host memory,
  // the CPU kernels). stream: the caller's stream its work is ordered after.
  std::shared_ptr<DeviceBackend> device;
  int ordinal = -1;
  void* stream = nullptr;
  size_t offloadChunkElems = size_t{4} << 20;  // offloaded steps: elements per chunk moved
  // Each parameter's communication priority (higher goes first among ops ready
  // together): a unit's collectives take the highest of its parameters'. Empty: all 0.
  std::vector<int32_t> priorities;
  // The reduced gradients are the set's average times this: an expert-data-parallel
  // set's experts are averaged over every data-parallel rank (set size / dp size).
  double gradFactor = 1.0;
};

class Engine {
 public:
  Engine(Runtime& rt, EngineSpec spec);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  int stage() const { return stage_; }
  int world() const { return world_; }
  int rank() const { return rank_; }
  const PartitionPlan& plan() const { return *plan_; }
  DataType dtype() const { return spec_.dtype; }
  size_t numParams() const { return spec_.numels.size(); }

  // Stages 0-2: where parameter i lives (the module's parameter is a view of it).
  void* paramStorage(size_t i);
  // Initial value of parameter i (full, model dtype). Every rank calls it for every
  // parameter, then finishInit() makes all ranks start from the set's first rank's values.
  void loadParam(size_t i, const void* src);
  void finishInit();
  // After finishInit: parameter i becomes src (its full value, the same on every
  // rank; GatheredParameters(modifier_rank=) broadcast it): this rank's slice of
  // the 16-bit parameters and of the fp32 master, and any gathered copy.
  void assignParam(size_t i, const void* src);

  // Backward: gradient of parameter i for this micro-batch (full, model dtype).
  void gradReady(size_t i, const void* grad);
  // After each backward: stages 2-3 finish reducing this micro-batch's gradients.
  void endBackward();
  // At the accumulation boundary.
  StepResult step(const std::vector<GroupHyper>& groups);
  // For an optimizer chorus cannot run itself: stepExternal() leaves the unscaled,
  // clipped fp32 gradients of the partition in externalGrad(), the caller updates
  // master() in place, then publishExternal() spreads the new parameters.
  StepResult stepExternal();
  // Engines that share one model (MoE: the shared parameters' engine and each
  // expert group's) share one norm: each finishes its reductions and gives the
  // sum of squares of its (loss-scaled) gradients over its set, the caller adds
  // them up over the model, and each steps with that total.
  double gradSumSquares();
  StepResult step(const std::vector<GroupHyper>& groups, double totalSumSquares);
  StepResult stepExternal(double totalSumSquares);
  // The same in two halves, for an optimizer that changes the gradients before they are
  // measured (Muon orthogonalizes them; DeepSpeed's ZeRO clips the result):
  // prepareExternal() finishes the reductions and leaves the unscaled fp32 gradients in
  // externalGrad(); the caller may rewrite them; finishExternal() takes the norm over
  // them as they are now, skips or clips them in place, and counts the step.
  void prepareExternal();
  StepResult finishExternal();
  StepResult finishExternal(double totalSumSquares);
  void publishExternal();
  // The pieces of parameters rank r of the set holds (stage 0: the whole model, every rank).
  std::vector<Piece> piecesOf(int r) const { return plan_->pieces(stage_ == 0 ? 0 : r); }
  // The sum of squares of externalGrad() over this rank's pieces, weighted as the norm is.
  double externalSumSquares();
  // The same summed over the set (what finishExternal() measures), for engines that share one norm.
  double externalSetSumSquares() { return setSumSquares(externalSumSquares()); }
  // (Under nvme offload the state is in a file: these throw; use forState.)
  float* master() const;
  // The optimizer's state k (0, 1) over the partition, fp32; null where the optimizer has none.
  float* optimizerState(int k) const;
  bool stateOnDisk() const { return swap_ != nullptr; }
  // The master weights and the optimizer's states over [begin, end) of the partition,
  // a tile at a time: fn(offset, count, master, state1, state2) with the pointers at
  // element `offset` (state2 null where the optimizer has one state). In memory: one
  // call over the range; under nvme offload: tiles read from the file, and written
  // back after fn when `write`.
  using StateFn = std::function<void(size_t offset, size_t count, float* master, float* s1, float* s2)>;
  void forState(size_t begin, size_t end, bool write, const StateFn& fn) const;
  // Between host memory and a pointer forState gave.
  void copyOut(void* host, const float* state, size_t bytes) const { copyState(host, state, bytes); }
  void copyIn(float* state, const void* host, size_t bytes) const { copyState(state, host, bytes); }
  float* externalGrad();
  size_t partitionElems() const { return plan_->partitionElems(); }
  // (partition offset, length, optimizer group) of each run of the partition.
  std::vector<std::tuple<size_t, size_t, int>> runs() const;
  const std::vector<Piece>& pieces() const { return pieces_; }
  double lossScale() const { return scaler_.scale(); }
  // The dynamic loss scaler's state (scale, iteration, last overflow, hysteresis left), for
  // checkpoints in other layouts.
  std::string lossScalerState() const { return scaler_.serialize(); }
  void setLossScalerState(const std::string& s) { scaler_.deserialize(s); }
  int64_t optimizerSteps() const { return optSteps_; }
  // A checkpoint of another format (DeepSpeed's) restores the count its optimizer state was at.
  void setOptimizerSteps(int64_t steps) { optSteps_ = steps; }

  // Stage 3: gathering parameters before use and releasing them after.
  void gatherAsync(const std::vector<size_t>& params);
  // Waits for the gather of i; the buffer holds world * slice elements, the
  // parameter's first. Whoever views it holds the pointer, so release() is safe.
  std::shared_ptr<Buffer> gathered(size_t i);
  void release(size_t i);
  bool persistent(size_t i) const { return persistent_.at(i); }
  size_t liveBytes() const { return liveBytes_; }
  // Tensor::device of the engine's buffers (kHostDevice: host memory).
  int device() const { return mem_->device(); }
  bool onDevice(const void* p) const { return mem_->onDevice(p); }
  // Waits for the engine's device work (results read by the host or another stream).
  void sync() { mem_->sync(); }

  MemoryReport memory() const;
  const std::string& placement() const { return placement_; }

  // Checkpoints (engine_checkpoint.cc). extraMeta: JSON text stored beside the state.
  void saveShard(const std::string& path, const std::string& extraMeta) const;
  // The shard's contents copied out of the engine (an asynchronous save writes it later).
  ShardFile shardSnapshot(const std::string& extraMeta) const;
  // The same into f, reusing its buffers (no allocation or page faults when their sizes hold).
  void shardSnapshotInto(ShardFile& f, const std::string& extraMeta) const;
  // Loads the fp32 state from the shards of a checkpoint (any world size, any stage),
  // one shard at a time, keeping only what overlaps this rank's partition.
  // expectedExtra (when not empty): every shard must carry this extraMeta (the
  // save's identity), else the shards are of different saves and none is used.
  // paramMaps (when not empty): for each path, the parameter of this engine each of
  // the shard's parameters is (-1: none), for shards of an engine over other
  // parameters (MoE experts saved at another expert-parallel size).
  void loadShards(const std::vector<std::string>& paths, const std::string& expectedExtra = "",
                  const std::vector<std::vector<int64_t>>& paramMaps = {});
  std::string shardMeta(const std::string& extraMeta) const;
  // Whether this rank writes a shard (stage 0 keeps one replica, written by rank 0).
  bool writesShard() const { return stage_ > 0 || rank_ == 0; }

 private:
  size_t esize() const { return dtypeSize(spec_.dtype); }
  char* unitParams(size_t u) { return params_.bytes() + unitBase_[u] * esize(); }
  char* unitGrads(size_t u) { return grads_.bytes() + unitBase_[u] * esize(); }
  float* masterPtr() const;
  char* gradSlice(size_t u) const;   // the rank's reduced gradients of unit u
  char* paramSlice(size_t u) const;  // the rank's parameters of unit u
  void reduceAtBoundary();
  void zeroGrads();
  Tensor tensor(void* p, size_t n) const { return tensor(p, n, spec_.dtype); }
  Tensor tensor(void* p, size_t n, DataType dtype) const {
    return Tensor{p, dtype, {static_cast<int64_t>(n)}, mem_->device()};
  }
  // communication_data_type: gradients go to the reduction in commDtype_; recast_
  // when it is not the model's (each reduction then converts in and back out).
  bool recast() const { return commDtype_ != spec_.dtype; }
  size_t commEsize() const { return dtypeSize(commDtype_); }
  void convert(void* dst, DataType to, const void* src, DataType from, size_t n);
  template <typename O>
  O on(O o) const {  // an op's options with the engine's set and stream
    o.processSet = spec_.processSet;
    o.stream = mem_->stream();
    return o;
  }
  StepResult prepareStep(float* gradScale, const double* totalSumSquares);
  void finishReductions();
  double setSumSquares(double local);
  void sumOver(double* v, size_t n, int32_t set, const std::string& op);  // in place, over the process set  // summed over the set (stages 1-3) and the pipeline's stages
  // Skip (non-finite, as DeepSpeed skips) or not, the norm, and gradScale's clip factor.
  StepResult decide(double sumsq, bool unscaled, float* gradScale);
  StepResult finishExternalWith(const double* totalSumSquares);
  StepResult stepWith(const std::vector<GroupHyper>& groups, const double* totalSumSquares);
  StepResult stepExternalWith(const double* totalSumSquares);
  // The RunArgs of each piece's part within the tile [off, off + n) that forState gave.
  void forPieces(size_t off, size_t n, float* m, float* s1, float* s2, float gradScale,
                 const std::function<void(const Piece&, const RunArgs&)>& fn);
  void roundBf16(float* m, float* s1, float* s2, size_t n);
  // Between the model-dtype parameters (in mem_) and fp32 master weights (in mem_, or a host tile).
  void paramsToMaster(float* m, const char* params, size_t n) const;
  void masterToParams(char* params, const float* m, size_t n) const;
  void requireStateInMemory(const char* what) const;
  // A pass over the state: under nvme offload, every rank of the set learns whether any
  // rank's pass failed (then all raise, and the engine refuses further steps).
  void onDisk(const std::function<void()>& pass);
  bool stateBroken_ = false;
  void copyState(void* dst, const void* src, size_t bytes) const;  // a tile's or a buffer's bytes
  // Stage 3's 16-bit slices, elements [at, at + n) of the partition, in paramPart_ or on disk
  // (offload_param nvme): written from the engine's memory or the host, read to the host.
  void sliceWrite(size_t at, const void* src, size_t n);
  void sliceRead(size_t at, void* host, size_t n) const;
  void masterToSlices(const float* m, size_t at, size_t n);  // a host tile of master weights
  void lambStep(const std::vector<GroupHyper>& groups, float gradScale);
  void keepBf16Precision();  // bf16 master weights (and states): rounded to bf16 after each step
  int acquireBucket(size_t u);
  void launchUnit(size_t u);
  void completeOldest();
  void resetMissing();
  void publishParams();
  void regatherLive();
  std::string name(const char* what, size_t id) const;

  Runtime& rt_;
  EngineSpec spec_;
  std::string name_;  // prefix of this engine's op names (engines are made in the same order on every rank)
  std::string pipeName_;  // the norm's op name in the pipeline set
  double localSumSquares() const;  // of this rank's gradient slices, weighted by normWeights
  int32_t unitPriority(size_t u) const;
  int stage_, world_, rank_;
  size_t numGroups_ = 1;
  std::unique_ptr<PartitionPlan> plan_;
  std::vector<Piece> pieces_;
  std::vector<size_t> unitBase_;  // stages 0-2: element offset of each unit's flat buffer
  std::unique_ptr<Memory> mem_;  // where the buffers below live
  std::unique_ptr<NvmeSwap> swap_;  // offload_optimizer nvme: master_ (unless masterIsParams_) and the states
  std::unique_ptr<Memory> host_;    // with swap_: the tiles' conversions
  std::unique_ptr<NvmeSwap> paramSwap_;  // offload_param nvme: stage 3's slices (paramPart_ then unused)
  // Stage 3 with the optimizer on nvme, on the host: the reduced gradients in a file too (gradPart_
  // then unused), as DeepSpeed swaps them; written a unit at a time as reductions finish, read a
  // tile at a time beside the state's tiles at the step.
  std::unique_ptr<NvmeSwap> gradSwap_;
  std::vector<bool> gradFresh_;  // units not written since zeroGrads (zero, whatever the file holds)
  std::string gradError_;        // a failed gradient write, raised on every rank at the norm
  const char* gradTile_ = nullptr;  // withGradTile: the tile's gradients, from element gradTileAt_
  size_t gradTileAt_ = 0;
  void addReduced(size_t u, const void* reduced, size_t n);  // into unit u's gradient slice
  const char* gradAt(size_t u, size_t in) const;  // element `in` of unit u's gradient slice
  void withGradTile(size_t off, size_t n, const std::function<void()>& fn);  // gradAt valid within
  void writeFreshGrads();  // the zeros of units no reduction wrote, on disk
  double diskSumSquares();
  Buffer params_, paramPart_, grads_, gradPart_, master_, state1_, state2_, externalGrad_;
  Buffer agIn_[2];
  DataType commDtype_;
  Buffer commGrads_;  // stages 0-1 with recast(): every unit's gradients in commDtype_
  Buffer convScratch_;  // convert()'s fp32 step between two 16-bit dtypes
  Buffer recvScratch_;  // stages 2-3 with recast(): a reduced slice back in the model's dtype
  Buffer bf16Scratch_;  // keepBf16Precision's bf16 copy  // publishParams: this rank's slice, two units in flight
  bool masterIsParams_ = false;
  LossScaler scaler_;
  int64_t optSteps_ = 0;
  struct Run {  // a stretch of one unit's slice that shares an optimizer group
    size_t unit, offset, length;
    int group;
  };
  std::vector<Run> runs_;

  // Stages 2-3: units being filled and reduced during backward.
  struct Bucket {
    Buffer data;
    size_t unit = SIZE_MAX;
    size_t missing = 0;
    std::unique_ptr<Work> work;
    Buffer comm;  // with recast(): data in commDtype_, what the reduce-scatter reads
  };
  std::vector<Bucket> pool_;
  std::vector<int> unitBucket_;        // bucket of each unit being filled, -1 if none
  std::deque<int> inFlight_;           // buckets reducing, oldest first
  std::vector<size_t> unitMissing_;    // gradients still to come per unit
  std::vector<bool> unitLaunched_;     // reduced already in this backward

  // Stage 3.
  std::vector<bool> persistent_;
  struct Gathered {
    std::shared_ptr<Buffer> data;
    std::shared_ptr<Buffer> up;  // offload_param on a device: this rank's slice brought up for the gather
    std::unique_ptr<Work> work;  // set while the gather runs
  };
  void launchGather(size_t i, Gathered& g);
  std::map<size_t, Gathered> live_;
  size_t liveBytes_ = 0;
  std::string placement_;
};

}  // namespace chorus::zero
