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
  shardSnapshot(extraMeta).write(path);
}

ShardFile Engine::shardSnapshot(const std::string& extraMeta) const {
  ShardFile f;
  shardSnapshotInto(f, extraMeta);
  return f;
}

void Engine::shardSnapshotInto(ShardFile& f, const std::string& extraMeta) const {
  const size_t part = plan_->partitionElems();
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
               {"partition_elems", part},
               {"pieces", pieces},
               {"extra", extraMeta}};
  f.meta = meta.dump();
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
  // One shard at a time: copy whatever part of it overlaps this rank's pieces.
  std::vector<std::vector<const Piece*>> mine(spec_.numels.size());
  size_t needed = 0, got = 0;
  for (const auto& p : pieces_) {
    mine[p.param].push_back(&p);
    needed += p.count;
  }
  // On a device or on disk, the shards' values gather in host memory first and go in at the end.
  const bool two = stateCount(spec_.optimizer) == 2;
  float* into[3] = {swap_ ? nullptr : masterPtr(), swap_ ? nullptr : state1_.as<float>(),
                    !swap_ && two ? state2_.as<float>() : nullptr};
  const bool has[3] = {true, true, two};
  const size_t partElems = plan_->partitionElems();
  std::vector<float> staged[3];
  float* dst[3];
  for (int k = 0; k < 3; ++k) {
    dst[k] = has[k] ? into[k] : nullptr;
    if (has[k] && (swap_ || mem_->device() != kHostDevice)) {
      staged[k].assign(partElems, 0.0f);
      dst[k] = staged[k].data();
    }
  }
  json first;
  for (size_t pi = 0; pi < paths.size(); ++pi) {
    const std::string& path = paths[pi];
    const ShardFile f = ShardFile::read(path);
    const json meta = json::parse(f.meta);
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
    const char* names[3] = {"master", "state1", "state2"};
    const float* src[3] = {nullptr, nullptr, nullptr};
    for (int k = 0; k < 3; ++k) {
      if (!dst[k]) continue;
      auto it = f.blobs.find(names[k]);
      if (it == f.blobs.end()) throw fail(std::string("it has no '") + names[k] + "' state");
      if (it->second.size() != part * 4) throw fail(std::string("'") + names[k] + "' has the wrong size");
      src[k] = reinterpret_cast<const float*>(it->second.data());
    }
    for (const auto& q : meta.at("pieces")) {
      const size_t saved = q[0], po = q[1], qo = q[2], count = q[3];
      if (saved >= numels.size() || po + count > numels[saved] || qo + count > part)
        throw fail("a piece lies outside its parameter or partition");
      if (to[saved] < 0) continue;
      const size_t param = static_cast<size_t>(to[saved]);
      for (const Piece* p : mine[param]) {
        const size_t lo = std::max(po, p->paramOffset), hi = std::min(po + count, p->paramOffset + p->count);
        if (hi <= lo) continue;
        for (int k = 0; k < 3; ++k)
          if (dst[k])
            std::memcpy(dst[k] + p->partOffset + (lo - p->paramOffset), src[k] + qo + (lo - po), (hi - lo) * 4);
        got += hi - lo;
      }
    }
    if (first.is_null()) first = meta;
  }
  if (got != needed)
    throw InvalidArgument("checkpoint is incomplete: the shards given hold " + std::to_string(got) + " of the " +
                          std::to_string(needed) + " elements this rank needs");
  if (swap_) {
    forState(0, partElems, true, [&](size_t off, size_t n, float* m, float* s1, float* s2) {
      float* to[3] = {m, s1, s2};
      for (int k = 0; k < 3; ++k)
        if (to[k]) copyState(to[k], staged[k].data() + off, n * 4);
    });
  } else {
    for (int k = 0; k < 3; ++k)
      if (!staged[k].empty()) mem_->copy(into[k], staged[k].data(), partElems * 4);
  }
  // The model's parameters from the loaded master weights: this rank's slices,
  // then (stages 1-3) everyone's slices through the usual gathers.
  const float* master = swap_ ? staged[0].data() : masterPtr();
  for (const auto& p : pieces_) {
    if (paramSwap_) {
      masterToSlices(master + p.partOffset, p.partOffset, p.count);
      continue;
    }
    char* at = stage_ == 3 ? paramPart_.bytes() + p.partOffset * esize()
                           : static_cast<char*>(paramStorage(p.param)) + p.paramOffset * esize();
    if (swap_)
      masterToParams(at, master + p.partOffset, p.count);
    else
      mem_->fromFloat(at, master + p.partOffset, spec_.dtype, p.count);
  }
  optSteps_ = first.at("optimizer_steps").get<int64_t>();
  scaler_.deserialize(first.at("loss_scaler").get<std::string>());
  zeroGrads();
  publishParams();
}

}  // namespace chorus::zero
