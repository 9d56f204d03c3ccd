#pragma once
// Which CPUs each local rank may run on. Binding one rank per core (or block of
// cores) keeps the scheduler from stacking two ranks that wait on each other
// onto one core, which is what makes shared-memory collectives slow and erratic.
#include <string>
#include <vector>

namespace chorus::launcher {

// policy: "none", "core" (bind, or throw when ranks outnumber cores) or "auto"
// (bind when every rank can have a core of its own, else not). Returns one CPU
// list per rank, each a block of the CPUs chorusrun may use; empty lists mean
// no binding. Throws std::invalid_argument on a bad policy.
std::vector<std::vector<int>> planBinding(const std::string& policy, int ranks);

// Restricts the calling process to cpus (no-op when empty). Returns false on failure.
bool bindTo(const std::vector<int>& cpus);

}  // namespace chorus::launcher
