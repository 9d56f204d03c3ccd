#include "launcher/binding.h"

#include <sched.h>

#include <stdexcept>

namespace chorus::launcher {

namespace {
std::vector<int> allowedCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  return cpus;
}
}  // namespace

std::vector<std::vector<int>> planBinding(const std::string& policy, int ranks) {
  if (policy != "auto" && policy != "core" && policy != "none")
    throw std::invalid_argument("--bind-to " + policy + ": use auto, core or none");
  std::vector<std::vector<int>> plan(ranks);
  const std::vector<int> cpus = allowedCpus();
  const int n = static_cast<int>(cpus.size());
  if (policy == "none" || ranks <= 0 || n == 0) return plan;
  if (ranks > n) {
    if (policy == "auto") return plan;
    throw std::invalid_argument("--bind-to core: " + std::to_string(ranks) + " ranks but only " +
                                std::to_string(n) + " CPUs to bind them to (use --bind-to none)");
  }
  // Equal blocks of neighbouring CPUs; any remainder stays unused, as with mpirun.
  const int per = n / ranks;
  for (int r = 0; r < ranks; ++r) plan[r].assign(cpus.begin() + r * per, cpus.begin() + (r + 1) * per);
  return plan;
}

bool bindTo(const std::vector<int>& cpus) {
  if (cpus.empty()) return true;
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) CPU_SET(c, &set);
  return sched_setaffinity(0, sizeof(set), &set) == 0;
}

}  // namespace chorus::launcher
