// An elastic worker joins only rounds after the one current when it started: a
// replacement that keeps a dead worker's host:slot must not take that worker's
// place in its round (whose other members have moved on).
#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <future>
#include <string>
#include <thread>

#include "chorus/runtime.h"
#include "chorus/store.h"
#include "base/elastic_keys.h"

namespace {

void put(chorus::Store& s, const std::string& key, const std::string& v) {
  s.set(key, std::vector<char>(v.begin(), v.end()));
}
std::string get(chorus::Store& s, const std::string& key) {
  const auto v = s.get(key, std::chrono::seconds(5));
  return std::string(v.begin(), v.end());
}

std::pair<int, int> joinWith(const std::string& startRound) {
  const std::string secret = "round-test-secret";
  auto server = chorus::startTcpStoreServer("127.0.0.1", 0, secret);
  auto store = chorus::connectTcpStore("127.0.0.1", server->port(), secret, std::chrono::seconds(5));
  // The dead worker's place in round 3: rank 1 of 2.
  put(*store, chorus::elastic::kRoundKey, "3");
  put(*store, chorus::elastic::roundKey(3, "h:0"), "1 2 0");
  setenv("CHORUS_RENDEZVOUS_ADDR", "127.0.0.1", 1);
  setenv("CHORUS_RENDEZVOUS_PORT", std::to_string(server->port()).c_str(), 1);
  setenv("CHORUS_SECRET", secret.c_str(), 1);
  setenv("CHORUS_ELASTIC_WORKER", "h:0", 1);
  setenv("CHORUS_ELASTIC_TIMEOUT", "20", 1);
  if (startRound.empty()) unsetenv("CHORUS_ELASTIC_ROUND");
  else setenv("CHORUS_ELASTIC_ROUND", startRound.c_str(), 1);
  chorus::Runtime rt;
  auto joined = std::async(std::launch::async, [&] { return rt.elasticJoinNextRound(); });
  // The driver: once the worker waits after round 3, round 4 gives it rank 0 of 1.
  if (joined.wait_for(std::chrono::seconds(2)) == std::future_status::timeout) {
    EXPECT_EQ(get(*store, chorus::elastic::waitKey("h:0")), "3");
    put(*store, chorus::elastic::roundKey(4, "h:0"), "0 1 0");
    put(*store, chorus::elastic::kRoundKey, "4");
  }
  const auto place = joined.get();
  for (const char* v : {"CHORUS_RENDEZVOUS_ADDR", "CHORUS_RENDEZVOUS_PORT", "CHORUS_SECRET", "CHORUS_ELASTIC_WORKER",
                        "CHORUS_ELASTIC_TIMEOUT", "CHORUS_ELASTIC_ROUND"})
    unsetenv(v);
  return place;
}

TEST(ElasticRound, AReplacementWaitsForARoundAfterTheOneCurrentAtItsStart) {
  EXPECT_EQ(joinWith("3"), std::make_pair(0, 1));
}

TEST(ElasticRound, AWorkerStartedBeforeARoundTakesItsPlaceInIt) {
  EXPECT_EQ(joinWith("2"), std::make_pair(1, 2));
}

}  // namespace
