// Checkpoint shards: each rank's fp32 partition (master weights and optimizer
// state) with the pieces that say which parameter elements it holds, so that a
// checkpoint loads on any world size and any stage.
#include <algorithm>
#include <cstring>
#include <numeric>
#include <nlohmann/json.hpp>

#include "chorus/error.h"
#include "zero/engine.h"
#include "zero/optimizer_step.h"
#include "zero/shard_file.h"

namespace chorus::zero {

using nlohmann::json;

namespace {
}  // namespace

void Engine::saveShard(const std::string& path, const std::string& extraMeta) const {
  if (!swap_) {
    shardSnapshot(extraMeta).write(path);
    return;
  }
  // State on disk goes from its tiles to the file, one array at a time: never whole in memory.
  ShardFile f;
  f.meta = shardMeta(extraMeta);
  const size_t part = plan_->partitionElems();
  const char* names[3] = {"master", "state1", "state2"};
  for (int k = 0; k < (stateCount(spec_.optimizer) == 2 ? 3 : 2); ++k)
    f.streamed[names[k]] = {part * 4, [this, k, part](const ShardFile::Put& put) {
                              std::vector<float> host;
                              forState(0, part, false, [&](size_t, size_t n, float* m, float* s1, float* s2) {
                                const float* from = k == 0 ? m : k == 1 ? s1 : s2;
                                host.resize(n);
                                copyState(host.data(), from, n * 4);
                                put(host.data(), n * 4);
                              });
                            }};
  f.write(path);
}

std::string Engine::shardMeta(const std::string& extraMeta) const {
  json pieces = json::array();
  for (const auto& p : pieces_) pieces.push_back({p.param, p.paramOffset, p.partOffset, p.count});
  json meta = {{"format", 1},
               {"stage", stage_},
               {"world", plan_->world()},
               {"rank", stage_ == 0 ? 0 : rank_},
               {"dtype", dtypeName(spec_.dtype)},
               {"numels", spec_.numels},
               {"optimizer", static_cast<int>(spec_.optimizer)},
               {"optimizer_steps", optSteps_},
               {"loss_scaler", scaler_.serialize()},
               {"partition_elems", plan_->partitionElems()},
               {"pieces", pieces},
               {"extra", extraMeta}};
  return meta.dump();
}

ShardFile Engine::shardSnapshot(const std::string& extraMeta) const {
  ShardFile f;
  shardSnapshotInto(f, extraMeta);
  return f;
}

void Engine::shardSnapshotInto(ShardFile& f, const std::string& extraMeta) const {
  const size_t part = plan_->partitionElems();
  f.meta = shardMeta(extraMeta);
  const bool two = stateCount(spec_.optimizer) == 2;
  std::string* into[3] = {&f.blobs["master"], &f.blobs["state1"], two ? &f.blobs["state2"] : nullptr};
  if (!two) f.blobs.erase("state2");
  for (std::string* b : into)
    if (b) b->resize(part * 4);  // (same size as last time: nothing allocated or touched)
  forState(0, part, false, [&](size_t off, size_t n, float* m, float* s1, float* s2) {
    const float* from[3] = {m, s1, s2};
    for (int k = 0; k < 3; ++k)
      if (into[k]) copyState(into[k]->data() + off * 4, from[k], n * 4);
  });
}

void Engine::copyState(void* dst, const void* src, size_t bytes) const {
  if (swap_ && !mem_->onDevice(dst) && !mem_->onDevice(src))
    std::memcpy(dst, src, bytes);  // (a tile from disk)
  else
    mem_->copy(dst, src, bytes);
}

void Engine::loadShards(const std::vector<std::string>& paths, const std::string& expectedExtra,
                        const std::vector<std::vector<int64_t>>& paramMaps) {
  if (paths.empty()) throw InvalidArgument("ZeRO engine: no checkpoint shards to load");
  if (!paramMaps.empty() && paramMaps.size() != paths.size())
    throw InvalidArgument("ZeRO engine: " + std::to_string(paramMaps.size()) + " parameter maps for " +
                          std::to_string(paths.size()) + " shards");
  // Every shard of one save, before any state is touched: a mixture of saves would load silently.
  if (!expectedExtra.empty()) {
    for (const auto& path : paths) {
      const std::string extra = json::parse(ShardFile::readMeta(path)).value("extra", std::string());
      if (extra != expectedExtra)
        throw InvalidArgument("checkpoint shard '" + path + "' belongs to another save (" +
                              (extra.empty() || extra == "{}" ? std::string("no save identity") : extra) +
                              ") than the checkpoint's model states (" + expectedExtra +
                              "): its files come from different saves; save again or restore the folder");
    }
  }
  // Each shard checked whole, then read by ranges: what overlaps this rank's pieces.
  std::vector<std::vector<const Piece*>> mine(spec_.numels.size());
  size_t needed = 0, got = 0;
  for (const auto& p : pieces_) {
    mine[p.param].push_back(&p);
    needed += p.count;
  }
  const bool two = stateCount(spec_.optimizer) == 2;
  const char* names[3] = {"master", "state1", "state2"};
  const int arrays = two ? 3 : 2;
  struct Copy {  // count elements from a shard's partition offset to this rank's
    size_t shard, from, to, count;
  };
  std::vector<Copy> copies;
  std::vector<std::unique_ptr<ShardReader>> readers;
  json first;
  for (size_t pi = 0; pi < paths.size(); ++pi) {
    const std::string& path = paths[pi];
    readers.push_back(std::make_unique<ShardReader>(path));
    const ShardReader& f = *readers.back();
    const json meta = json::parse(f.meta());
    auto fail = [&](const std::string& why) { return InvalidArgument("checkpoint shard '" + path + "': " + why); };
    const auto numels = meta.at("numels").get<std::vector<size_t>>();
    std::vector<int64_t> to(numels.size());
    std::iota(to.begin(), to.end(), int64_t{0});
    if (!paramMaps.empty()) {
      to = paramMaps[pi];
      if (to.size() != numels.size())
        throw fail("it has " + std::to_string(numels.size()) + " parameters, its map " + std::to_string(to.size()));
      for (size_t k = 0; k < to.size(); ++k)
        if (to[k] >= 0 && (static_cast<size_t>(to[k]) >= spec_.numels.size() || numels[k] != spec_.numels[to[k]]))
          throw fail("its parameter " + std::to_string(k) + " does not match the one it maps to");
    } else if (numels != spec_.numels) {
      throw fail("its parameters (count or sizes) differ from this model's");
    }
    if (meta.at("optimizer").get<int>() != static_cast<int>(spec_.optimizer))
      throw fail("it was saved with a different optimizer type");
    const size_t part = meta.at("partition_elems").get<size_t>();
    for (int k = 0; k < arrays; ++k) {
      if (f.size(names[k]) < 0) throw fail(std::string("it has no '") + names[k] + "' state");
      if (static_cast<size_t>(f.size(names[k])) != part * 4) throw fail(std::string("'") + names[k] + "' has the wrong size");
    }
    for (const auto& q : meta.at("pieces")) {
      const size_t saved = q[0], po = q[1], qo = q[2], count = q[3];
      if (saved >= numels.size() || po + count > numels[saved] || qo + count > part)
        throw fail("a piece lies outside its parameter or partition");
      if (to[saved] < 0) continue;
      for (const Piece* p : mine[static_cast<size_t>(to[saved])]) {
        const size_t lo = std::max(po, p->paramOffset), hi = std::min(po + count, p->paramOffset + p->count);
        if (hi <= lo) continue;
        copies.push_back({pi, qo + (lo - po), p->partOffset + (lo - p->paramOffset), hi - lo});
        got += hi - lo;
      }
    }
    if (first.is_null()) first = meta;
  }
  if (got != needed)
    throw InvalidArgument("checkpoint is incomplete: the shards given hold " + std::to_string(got) + " of the " +
                          std::to_string(needed) + " elements this rank needs");
  // Into the state a tile at a time (in memory: one tile; on a device, through the host),
  // then the model's parameters from the loaded master weights: this rank's slices, and
  // (stages 1-3) everyone's through the usual gathers.
  const bool staged = !swap_ && mem_->device() != kHostDevice;
  std::vector<float> tile[3];
  const size_t es = esize();
  forState(0, plan_->partitionElems(), true, [&](size_t off, size_t n, float* m, float* s1, float* s2) {
    float* dst[3] = {m, s1, s2};
    if (staged)
      for (int k = 0; k < arrays; ++k) tile[k].assign(n, 0.0f);  // (the partition's padding: zero)
    for (const Copy& c : copies) {
      const size_t lo = std::max(c.to, off), hi = std::min(c.to + c.count, off + n);
      if (lo >= hi) continue;
      for (int k = 0; k < arrays; ++k)
        readers[c.shard]->read(names[k], (c.from + (lo - c.to)) * 4,
                               (staged ? tile[k].data() : dst[k]) + (lo - off), (hi - lo) * 4);
    }
    if (staged)
      for (int k = 0; k < arrays; ++k) copyState(dst[k], tile[k].data(), n * 4);
    const float* master = m;  // (in mem_'s memory, or a host tile of the file's)
    for (const auto& p : pieces_) {
      const size_t lo = std::max(p.partOffset, off), hi = std::min(p.partOffset + p.count, off + n);
      if (lo >= hi) continue;
      if (paramSwap_) {
        masterToSlices(master + (lo - off), lo, hi - lo);
        continue;
      }
      char* at = stage_ == 3 ? paramPart_.bytes() + lo * es
                             : static_cast<char*>(paramStorage(p.param)) + (p.paramOffset + lo - p.partOffset) * es;
      masterToParams(at, master + (lo - off), hi - lo);
    }
  });
  optSteps_ = first.at("optimizer_steps").get<int64_t>();
  scaler_.deserialize(first.at("loss_scaler").get<std::string>());
  zeroGrads();
  publishParams();
}

}  // namespace chorus::zero
