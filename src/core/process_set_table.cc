#include "core/process_set_table.h"

#include <algorithm>
#include <sstream>

#include "chorus/error.h"

namespace chorus {

ProcessSet::ProcessSet(int32_t id, std::vector<int> ranks, int globalRank)
    : id_(id), ranks_(std::move(ranks)) {
  auto it = std::find(ranks_.begin(), ranks_.end(), globalRank);
  rankInSet_ = it == ranks_.end() ? -1 : static_cast<int>(it - ranks_.begin());
}


std::string listString(const std::vector<int>& v) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  os << "]";
  return os.str();
}

std::vector<int> validateRanks(const std::vector<int>& ranks, int worldSize) {
  if (ranks.empty()) throw InvalidArgument("a process set needs at least one rank");
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i) {
    if (sorted[i] < 0 || sorted[i] >= worldSize) {
      throw InvalidArgument("process set " + listString(ranks) + ": rank " + std::to_string(sorted[i]) +
                            " is out of range for a job of size " + std::to_string(worldSize));
    }
    if (i > 0 && sorted[i] == sorted[i - 1]) {
      throw InvalidArgument("process set " + listString(ranks) + ": rank " + std::to_string(sorted[i]) +
                            " appears more than once");
    }
  }
  return sorted;
}

void ProcessSetTable::add(const ProcessSet& ps, std::shared_ptr<Controller> controller) {
  std::lock_guard<std::mutex> lock(mu_);
  sets_[ps.id()] = Record{ps, std::move(controller)};
}

std::shared_ptr<Controller> ProcessSetTable::remove(int32_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sets_.find(id);
  if (it == sets_.end()) return nullptr;
  auto c = it->second.controller;
  sets_.erase(it);
  return c;
}

ProcessSet ProcessSetTable::get(int32_t id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sets_.find(id);
  if (it == sets_.end()) {
    throw InvalidArgument("process set " + std::to_string(id) +
                          " is not registered (it was never added, or it was removed)");
  }
  return it->second.ps;
}

std::shared_ptr<Controller> ProcessSetTable::controllerFor(int32_t id, int globalRank) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sets_.find(id);
  if (it == sets_.end()) {
    throw InvalidArgument("process set " + std::to_string(id) +
                          " is not registered (it was never added, or it was removed)");
  }
  if (!it->second.controller) {
    throw InvalidArgument("rank " + std::to_string(globalRank) + " is not in process set " +
                          std::to_string(id) + " (ranks " + listString(it->second.ps.ranks()) +
                          "); only its members may run collectives on it");
  }
  return it->second.controller;
}

std::vector<ProcessSet> ProcessSetTable::all() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<ProcessSet> out;
  for (const auto& [id, rec] : sets_) out.push_back(rec.ps);
  return out;
}

std::vector<std::shared_ptr<Controller>> ProcessSetTable::controllers() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::shared_ptr<Controller>> out;
  for (const auto& [id, rec] : sets_)
    if (rec.controller) out.push_back(rec.controller);
  return out;
}

int32_t ProcessSetTable::find(const std::vector<int>& ranks) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [id, rec] : sets_)
    if (rec.ps.ranks() == ranks) return id;
  return -1;
}

void ProcessSetTable::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  sets_.clear();
}

}  // namespace chorus
