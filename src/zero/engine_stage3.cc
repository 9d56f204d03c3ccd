// Stage 3: parameters live as slices; a module's parameters are gathered before
// its forward and backward and released after.
#include <cstring>
#include <vector>

#include "chorus/error.h"
#include "zero/engine.h"

namespace chorus::zero {

void Engine::launchGather(size_t i, Gathered& g) {
  const size_t u = plan_->unitOf(i), j = plan_->indexInUnit(i), s = plan_->units()[u].slices[j];
  const size_t at = plan_->units()[u].partOffset + plan_->units()[u].offsets[j];
  char* in = paramSwap_ ? nullptr : paramPart_.bytes() + at * esize();
  if (paramSwap_) {  // offload_param nvme: read from disk just in time (then up, on a device)
    std::vector<char> host;
    char* to;
    if (mem_->device() == kHostDevice) {
      if (!g.up || g.up->size() < s * esize()) g.up = std::make_shared<Buffer>(mem_->scratch(s * esize()));
      to = g.up->bytes();
    } else {
      host.resize(s * esize());
      to = host.data();
    }
    sliceRead(at, to, s);
    if (mem_->device() != kHostDevice) {
      if (!g.up || g.up->size() < s * esize()) g.up = std::make_shared<Buffer>(mem_->scratch(s * esize()));
      mem_->copy(g.up->bytes(), host.data(), s * esize());
      mem_->sync();  // (host is freed on return)
    }
    in = g.up->bytes();
  } else if (mem_->device() != kHostDevice && !mem_->onDevice(in)) {  // offload_param: up just in time
    if (!g.up || g.up->size() < s * esize()) g.up = std::make_shared<Buffer>(mem_->scratch(s * esize()));
    mem_->copy(g.up->bytes(), in, s * esize());
    in = g.up->bytes();
  }
  char* out = g.data->bytes();
  OpOptions o;
  o.name = name("ag", i);
  o.priority = spec_.priorities.empty() ? 0 : spec_.priorities[i];
  g.work = std::make_unique<Work>(
      rt_.allgatherAsync(tensor(in, s), on(o), [out](const Shape&, DataType) -> void* { return out; }));
}

void Engine::gatherAsync(const std::vector<size_t>& params) {
  if (stage_ != 3) throw InvalidArgument("ZeRO engine: only stage 3 gathers parameters");
  for (size_t i : params) {
    if (i >= spec_.numels.size()) throw InvalidArgument("ZeRO engine: no parameter " + std::to_string(i));
    if (live_.count(i)) continue;
    Gathered g;
    g.data = std::make_shared<Buffer>(mem_->scratch(world_ * plan_->paramSlice(i) * esize()));
    launchGather(i, g);
    liveBytes_ += g.data->size();
    live_.emplace(i, std::move(g));
  }
}

std::shared_ptr<Buffer> Engine::gathered(size_t i) {
  if (!live_.count(i)) gatherAsync({i});
  Gathered& g = live_.at(i);
  if (g.work) {
    std::unique_ptr<Work> w = std::move(g.work);
    w->wait();
    mem_->await(*w);
  }
  return g.data;
}

void Engine::release(size_t i) {
  if (persistent_.at(i)) return;
  auto it = live_.find(i);
  if (it == live_.end()) return;
  if (it->second.work) {  // (a prefetch never used: its gather still writes the buffer)
    it->second.work->wait();
    mem_->await(*it->second.work);
  }
  mem_->retire(it->second.data);  // (freed once the work queued on it, the caller's too, is done)
  if (it->second.up) mem_->retire(it->second.up);
  liveBytes_ -= it->second.data->size();
  live_.erase(it);
}

void Engine::regatherLive() {
  if (stage_ != 3) return;
  // Persistent parameters are always live; anything else still live must not go stale.
  for (size_t i = 0; i < spec_.numels.size(); ++i)
    if (persistent_[i] && !live_.count(i)) {
      Gathered g;
      g.data = std::make_shared<Buffer>(mem_->scratch(world_ * plan_->paramSlice(i) * esize()));
      liveBytes_ += g.data->size();
      live_.emplace(i, std::move(g));
    }
  for (auto& [i, g] : live_) {
    if (g.work) {
      g.work->wait();
      mem_->await(*g.work);
    }
    launchGather(i, g);
  }
  for (auto& [i, g] : live_) {
    std::unique_ptr<Work> w = std::move(g.work);
    w->wait();
    mem_->await(*w);
  }
}

}  // namespace chorus::zero
