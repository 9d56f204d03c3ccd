#pragma once
// How the data of a large shared-memory collective reaches the other ranks:
// through the caches (a slot written with ordinary stores is read from the
// writer's cache) or through memory (the slot is written with non-temporal
// stores and read back from DRAM). Which is faster depends on where the cores
// sit: on some VMs a cache-to-cache transfer between two vCPUs costs more than
// a round trip through memory, and the hypervisor moves vCPUs at run time.
// So, unless a setting forces one, large collectives measure both and use the
// faster, trying the other one now and then.
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

namespace chorus {

enum class PeerPath { kAuto, kCache, kMemory };

// "auto", "cache" or "memory"; throws InvalidArgument naming the setting otherwise.
PeerPath parsePeerPath(const std::string& value);

// One per communicator. Every rank makes the same sequence of calls (the ops of
// a set are collective), so the schedule of tries is the same on all ranks; the
// decisions only affect speed, never results, so a rare disagreement is harmless.
class PeerPathChooser {
 public:
  explicit PeerPathChooser(PeerPath forced = PeerPath::kAuto) : forced_(forced) {}
  PeerPath forced() const { return forced_; }
  void force(PeerPath p) { forced_ = p; }  // (autotune: between two collectives, on every rank)

  // The path for the next collective of this kind (op) and size.
  bool viaMemory(int op, size_t bytes);
  // What that collective took, in seconds.
  void record(int op, size_t bytes, bool viaMemory, double seconds);

  // One call in kExploreEvery tries the slower path; one in kExploreRarely when
  // it was more than kFarApart slower (each try then costs more, and a change
  // of the machine that makes up such a gap is rarer): a 2-rank 256 MiB
  // allgather on the automatic choice ran 5% behind the faster path forced.
  static constexpr int kExploreEvery = 8;
  static constexpr int kExploreRarely = 32;
  static constexpr double kFarApart = 1.25;

 private:
  // The latest few times of one path, compared by their median: on these VMs a
  // path's times are often bimodal, and one slow call must not flip the choice.
  struct Arm {
    static constexpr int kKept = 5;
    double secondsPerByte[kKept] = {};
    int samples = 0;
    double median() const;
  };
  struct Stats {
    Arm arms[2];  // [0] cache, [1] memory
    uint64_t calls = 0;
  };
  static uint64_t key(int op, size_t bytes);

  PeerPath forced_;
  std::map<uint64_t, Stats> stats_;
};

}  // namespace chorus
