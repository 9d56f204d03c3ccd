#pragma once
// The store keys through which the elastic driver (elastic_rounds.h) and the workers of an
// elastic job agree on rounds (the sets of workers that train together):
//   elastic/round            the latest round N the driver published
//   elastic/r<N>/<worker>    "rank size updates" of a worker in round N (absent: not
//                            in it); updates: the host-set changes the round includes
//   elastic/wait/<worker>    L: the worker waits for a round after L
//   elastic/updated          "<count> <removed only>": the host set changed count
//                            times; the workers' state.commit() raises
//                            HostsUpdatedInterrupt when it grew
// The driver publishes round N+1 once every live worker it wants waits after N.
#include <string>

namespace chorus::elastic {

inline const char* kRoundKey = "elastic/round";
inline const char* kUpdatedKey = "elastic/updated";
inline std::string roundKey(int64_t round, const std::string& worker) {
  return "elastic/r" + std::to_string(round) + "/" + worker;
}
inline std::string waitKey(const std::string& worker) { return "elastic/wait/" + worker; }

}  // namespace chorus::elastic
