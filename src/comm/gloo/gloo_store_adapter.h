#pragma once
// Lets Gloo's rendezvous read and write chorus's Store under a key prefix.
#include <gloo/rendezvous/store.h>

#include <chrono>
#include <string>

#include "chorus/store.h"

namespace chorus {

class GlooStoreAdapter : public gloo::rendezvous::Store {
 public:
  GlooStoreAdapter(chorus::Store& store, std::string prefix, std::chrono::milliseconds timeout)
      : store_(store), prefix_(std::move(prefix)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    store_.set(prefix_ + key, data);
  }
  std::vector<char> get(const std::string& key) override {
    return store_.get(prefix_ + key, timeout_);
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    for (const auto& k : keys) store_.get(prefix_ + k, timeout);
  }

 private:
  chorus::Store& store_;
  std::string prefix_;
  std::chrono::milliseconds timeout_;
};

}  // namespace chorus
