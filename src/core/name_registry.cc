#include "core/name_registry.h"

#include <algorithm>

namespace chorus {

int32_t NameRegistry::claim(const std::string& name, int32_t setId) {
  std::lock_guard<std::mutex> lock(mu_);
  auto [it, fresh] = inFlight_.emplace(name, setId);
  if (fresh) marked_.erase(name);
  return fresh ? -1 : it->second;
}

void NameRegistry::release(const std::string& name, int32_t setId) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = inFlight_.find(name);
  if (it != inFlight_.end() && it->second == setId) inFlight_.erase(it);
}

int32_t NameRegistry::setOf(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = inFlight_.find(name);
  return it == inFlight_.end() ? -1 : it->second;
}

void NameRegistry::publishMissing(int32_t setId, std::map<std::string, std::vector<int>> missing) {
  std::lock_guard<std::mutex> lock(mu_);
  missing_[setId] = std::move(missing);
}

std::vector<int> NameRegistry::missing(int32_t setId, const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto s = missing_.find(setId);
  if (s == missing_.end()) return {};
  auto it = s->second.find(name);
  return it == s->second.end() ? std::vector<int>{} : it->second;
}

void NameRegistry::setMembers(int32_t setId, const std::vector<int>& globalRanks) {
  std::lock_guard<std::mutex> lock(mu_);
  members_[setId] = globalRanks;
  sets_ = static_cast<int>(members_.size());
}

void NameRegistry::forgetSet(int32_t setId) {
  std::lock_guard<std::mutex> lock(mu_);
  members_.erase(setId);
  missing_.erase(setId);
  auto it = markers_.find(setId);
  if (it != markers_.end()) {
    queued_ -= static_cast<int>(it->second.size());
    markers_.erase(it);
  }
  sets_ = static_cast<int>(members_.size());
}

bool NameRegistry::severalSets() const { return sets_.load() > 1; }

bool NameRegistry::isMember(int32_t setId, int globalRank) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = members_.find(setId);
  return it != members_.end() && std::find(it->second.begin(), it->second.end(), globalRank) != it->second.end();
}

bool NameRegistry::postMarker(int32_t toSet, const std::string& name, int32_t conflictSet) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& sent = marked_[name];
  if (std::find(sent.begin(), sent.end(), toSet) != sent.end()) return false;
  sent.push_back(toSet);
  markers_[toSet].emplace_back(name, conflictSet);
  ++queued_;
  return true;
}

std::vector<std::pair<std::string, int32_t>> NameRegistry::takeMarkers(int32_t setId) {
  std::vector<std::pair<std::string, int32_t>> out;
  if (queued_.load() == 0) return out;  // (every cycle asks: no lock while there are none)
  std::lock_guard<std::mutex> lock(mu_);
  auto it = markers_.find(setId);
  if (it != markers_.end()) {
    out.swap(it->second);
    queued_ -= static_cast<int>(out.size());
  }
  return out;
}

}  // namespace chorus
