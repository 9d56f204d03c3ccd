#include "core/response_cache.h"

namespace chorus {

ResponseCache::ResponseCache(int capacity) : capacity_(capacity), slots_(capacity) {
  for (int i = capacity - 1; i >= 0; --i) free_.push_back(i);
}

ResponseCache::Lookup ResponseCache::lookup(const Request& req, int* pos) const {
  auto it = byName_.find(req.name);
  if (it == byName_.end()) return Lookup::kMiss;
  *pos = it->second;
  return slots_[it->second].request.sameParams(req) ? Lookup::kHit : Lookup::kStale;
}

int ResponseCache::put(const Response& resp, const Request& mine) {
  if (!enabled()) return -1;
  int evicted = -1;
  auto it = byName_.find(resp.name);
  int pos;
  if (it != byName_.end()) {
    pos = it->second;
    lru_.erase(slots_[pos].lru);
  } else {
    if (free_.empty()) {
      evicted = lru_.back();
      erase(evicted);
    }
    pos = free_.back();
    free_.pop_back();
    byName_[resp.name] = pos;
  }
  Slot& s = slots_[pos];
  s.used = true;
  s.response = resp;
  s.request = mine;
  lru_.push_front(pos);
  s.lru = lru_.begin();
  return evicted;
}

void ResponseCache::setEnabled(bool on) {
  off_ = !on;
  if (on) return;
  for (int pos = 0; pos < capacity_; ++pos) erase(pos);
}

void ResponseCache::touch(int pos) {
  Slot& s = slots_[pos];
  if (!s.used) return;
  lru_.splice(lru_.begin(), lru_, s.lru);  // (no node freed and made again)
}

void ResponseCache::erase(int pos) {
  Slot& s = slots_[pos];
  if (!s.used) return;
  lru_.erase(s.lru);
  byName_.erase(s.response.name);
  s.used = false;
  free_.push_back(pos);
}

}  // namespace chorus
