// Checkpoint shards: each rank's fp32 partition (master weights and optimizer
// state) with the pieces that say which parameter elements it holds, so that a
// checkpoint loads on any world size and any stage.
#include <cstring>
#include <nlohmann/json.hpp>

#include "chorus/error.h"
#include "zero/engine.h"
#include "zero/optimizer_step.h"
#include "zero/shard_file.h"

namespace chorus::zero {

using nlohmann::json;

namespace {
std::string floats(const float* p, size_t n) { return std::string(reinterpret_cast<const char*>(p), n * 4); }
}  // namespace

void Engine::saveShard(const std::string& path, const std::string& extraMeta) const {
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
  ShardFile f;
  f.meta = meta.dump();
  f.blobs["master"] = floats(masterPtr(), part);
  f.blobs["state1"] = floats(state1_.as<float>(), part);
  if (state2_.size()) f.blobs["state2"] = floats(state2_.as<float>(), part);
  f.write(path);
}

void Engine::loadShards(const std::vector<std::string>& paths) {
  if (paths.empty()) throw InvalidArgument("ZeRO engine: no checkpoint shards to load");
  struct Src {
    const float* data[3];
    size_t paramOffset, partOffset, count;
  };
  std::vector<ShardFile> files;
  std::vector<std::vector<Src>> byParam(spec_.numels.size());
  json first;
  for (const auto& path : paths) {
    files.push_back(ShardFile::read(path));
    const ShardFile& f = files.back();
    json meta = json::parse(f.meta);
    auto fail = [&](const std::string& why) { return InvalidArgument("checkpoint shard '" + path + "': " + why); };
    if (meta.at("numels").get<std::vector<size_t>>() != spec_.numels)
      throw fail("its parameters (count or sizes) differ from this model's");
    if (meta.at("optimizer").get<int>() != static_cast<int>(spec_.optimizer))
      throw fail("it was saved with a different optimizer type");
    const size_t part = meta.at("partition_elems").get<size_t>();
    const char* names[3] = {"master", "state1", "state2"};
    const float* data[3] = {nullptr, nullptr, nullptr};
    for (int k = 0; k < 3; ++k) {
      auto it = f.blobs.find(names[k]);
      if (it == f.blobs.end()) {
        if (k == 2 && spec_.optimizer == OptimKind::kSgd) continue;
        throw fail(std::string("it has no '") + names[k] + "' state");
      }
      if (it->second.size() != part * 4) throw fail(std::string("'") + names[k] + "' has the wrong size");
      data[k] = reinterpret_cast<const float*>(it->second.data());
    }
    for (const auto& p : meta.at("pieces")) {
      const size_t param = p[0], po = p[1], qo = p[2], count = p[3];
      if (param >= spec_.numels.size() || po + count > spec_.numels[param] || qo + count > part)
        throw fail("a piece lies outside its parameter or partition");
      byParam[param].push_back({{data[0], data[1], data[2]}, po, qo, count});
    }
    if (first.is_null()) first = meta;
  }
  for (size_t i = 0; i < spec_.numels.size(); ++i) {
    const size_t n = spec_.numels[i];
    std::vector<float> full[3] = {std::vector<float>(n), std::vector<float>(n), std::vector<float>(n)};
    std::vector<bool> seen(n, false);
    size_t covered = 0;
    for (const auto& s : byParam[i]) {
      for (int k = 0; k < 3; ++k)
        if (s.data[k]) std::memcpy(full[k].data() + s.paramOffset, s.data[k] + s.partOffset, s.count * 4);
      for (size_t e = s.paramOffset; e < s.paramOffset + s.count; ++e) covered += !seen[e], seen[e] = true;
    }
    if (covered != n)
      throw InvalidArgument("checkpoint is incomplete: the shards given hold " + std::to_string(covered) + " of " +
                            std::to_string(n) + " elements of parameter " + std::to_string(i));
    setFromFull(i, full[0].data(), full[1].data(), full[2].data());
  }
  optSteps_ = first.at("optimizer_steps").get<int64_t>();
  scaler_.deserialize(first.at("loss_scaler").get<std::string>());
  grads_.zero();
  gradPart_.zero();
  regatherLive();
}

void Engine::setFromFull(size_t i, const float* master, const float* s1, const float* s2) {
  for (const auto& p : pieces_) {
    if (p.param != i) continue;
    std::memcpy(masterPtr() + p.partOffset, master + p.paramOffset, p.count * 4);
    std::memcpy(state1_.as<float>() + p.partOffset, s1 + p.paramOffset, p.count * 4);
    if (state2_.size()) std::memcpy(state2_.as<float>() + p.partOffset, s2 + p.paramOffset, p.count * 4);
    if (stage_ == 3) fromFloat(paramPart_.bytes() + p.partOffset * esize(), master + p.paramOffset, spec_.dtype, p.count);
  }
  if (stage_ < 3) fromFloat(paramStorage(i), master, spec_.dtype, spec_.numels[i]);
}

}  // namespace chorus::zero
