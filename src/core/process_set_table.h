#pragma once
// The process sets a rank knows about, and the controllers of those it is in.
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "chorus/process_set.h"
#include "core/controller.h"

namespace chorus {

// "[0, 1, 2]", for messages.
std::string listString(const std::vector<int>& ranks);

// Sorts and checks a rank list; throws InvalidArgument naming the problem.
std::vector<int> validateRanks(const std::vector<int>& ranks, int worldSize);

class ProcessSetTable {
 public:
  void add(const ProcessSet& ps, std::shared_ptr<Controller> controller);
  std::shared_ptr<Controller> remove(int32_t id);
  ProcessSet get(int32_t id) const;
  // The controller of a set this rank is in; throws InvalidArgument otherwise.
  std::shared_ptr<Controller> controllerFor(int32_t id, int globalRank) const;
  std::vector<ProcessSet> all() const;
  std::vector<std::shared_ptr<Controller>> controllers() const;
  // Id of a registered set with exactly these ranks, or -1.
  int32_t find(const std::vector<int>& ranks) const;
  void clear();

 private:
  struct Record {
    ProcessSet ps;
    std::shared_ptr<Controller> controller;
  };
  mutable std::mutex mu_;
  std::map<int32_t, Record> sets_;
};

}  // namespace chorus
