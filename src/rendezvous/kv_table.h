#pragma once
// The store's state: a map with blocking reads. Shared by the in-memory store and
// the TCP server so both have the same semantics.
#include <chrono>
#include <cstring>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace chorus::rendezvous {

class KvTable {
 public:
  void set(const std::string& key, std::vector<char> value) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      map_[key] = std::move(value);
    }
    cv_.notify_all();
  }
  // nullopt on timeout.
  std::optional<std::vector<char>> get(const std::string& key, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, timeout, [&] { return map_.count(key) > 0; })) return std::nullopt;
    return map_[key];
  }
  int64_t add(const std::string& key, int64_t delta) {
    int64_t v = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = map_.find(key);
      if (it != map_.end() && it->second.size() == sizeof(int64_t)) {
        std::memcpy(&v, it->second.data(), sizeof(v));
      }
      v += delta;
      std::vector<char> bytes(sizeof(v));
      std::memcpy(bytes.data(), &v, sizeof(v));
      map_[key] = std::move(bytes);
    }
    cv_.notify_all();
    return v;
  }
  bool check(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    return map_.count(key) > 0;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::vector<char>> map_;
};

}  // namespace chorus::rendezvous
