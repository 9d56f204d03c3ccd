#pragma once
// Decides which requests are ready on every rank of a process set, in which
// order, and whether the ranks agree on them. Every rank runs an identical copy
// on the same gathered input, so every rank reaches the same decisions (and
// raises the same errors) without a second round trip.
#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/message.h"

namespace chorus {

class Coordinator {
 public:
  using Clock = std::chrono::steady_clock;
  // globalRanks[i] is the global rank of set rank i (for messages).
  Coordinator(std::vector<int> globalRanks, int32_t setId);

  // Must be called with every rank's requests, in rank order, on every rank.
  void submit(int rank, const Request& req, Clock::time_point now);
  // Responses that became ready since the last call, in the order they did.
  std::vector<Response> takeReady();
  bool anyJoined() const;

  struct Stall {
    std::string name;
    std::vector<int> missingRanks;  // global ranks
    double seconds = 0;
  };
  std::vector<Stall> stalls(Clock::time_point now, double olderThanSeconds) const;
  // Fails every pending op (each is an error response, `why` first, naming the
  // ranks that never submitted it): the ranks were all blocked on ops that
  // others never asked for. The table is empty afterwards.
  void failPending(const std::string& why);
  // Every pending name with the global ranks that have not submitted it.
  std::map<std::string, std::vector<int>> missingByName() const;
  // Changes whenever the pending table does.
  uint64_t version() const { return version_; }

 private:
  struct Pending {
    std::vector<std::optional<Request>> byRank;
    int count = 0;
    Clock::time_point firstSeen;
  };
  void checkReady(const std::string& name);
  std::string unjoinable(const Pending& p) const;
  Response build(const std::string& name, const Pending& p);
  std::string ranksOf(const std::vector<int>& setRanks) const;
  void emit(Response resp, const std::string& group, int groupSize);
  void finishJoinIfComplete();
  // Submits the deferred requests whose earlier entry is done.
  void submitDeferred(Clock::time_point now);

  std::vector<int> globalRanks_;
  int32_t setId_;
  uint64_t version_ = 0;
  int size_;
  std::map<std::string, Pending> table_;
  std::vector<std::string> arrival_;  // names in first-seen order
  std::vector<bool> joined_;
  int joinedCount_ = 0;
  int lastJoined_ = -1;
  struct GroupHold {
    int answered = 0;              // members negotiated or failed so far
    std::vector<Response> held;    // the negotiated ones, released together
  };
  std::map<std::string, GroupHold> groups_;
  // Requests that came after the same rank's marker for a name still pending.
  std::map<std::string, std::vector<std::pair<int, Request>>> deferred_;
  std::vector<Response> ready_;
};

}  // namespace chorus
