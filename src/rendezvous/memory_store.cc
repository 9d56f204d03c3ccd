#include "chorus/error.h"
#include "chorus/store.h"
#include "rendezvous/kv_table.h"

namespace chorus {

namespace {
class MemoryStore : public Store {
 public:
  void set(const std::string& key, const std::vector<char>& value) override { table_.set(key, value); }
  std::vector<char> get(const std::string& key, std::chrono::milliseconds timeout) override {
    auto v = table_.get(key, timeout);
    if (!v) throw Timeout("timed out after " + std::to_string(timeout.count()) +
                          " ms waiting for store key '" + key + "'");
    return std::move(*v);
  }
  int64_t add(const std::string& key, int64_t delta) override { return table_.add(key, delta); }
  bool check(const std::string& key) override { return table_.check(key); }

 private:
  rendezvous::KvTable table_;
};
}  // namespace

std::shared_ptr<Store> makeMemoryStore() { return std::make_shared<MemoryStore>(); }

}  // namespace chorus
