// The rendezvous store: TCP client/server with the job secret, and the in-memory store.
#include <gtest/gtest.h>

#include <thread>

#include "chorus/chorus.h"

namespace chorus {
namespace {

using namespace std::chrono_literals;

TEST(TcpStore, SetGetAddAndBlockingGet) {
  auto server = startTcpStoreServer("127.0.0.1", 0, "s3cret");
  auto a = connectTcpStore("127.0.0.1", server->port(), "s3cret", 5s);
  auto b = connectTcpStore("127.0.0.1", server->port(), "s3cret", 5s);
  a->set("k", {'v', '1'});
  EXPECT_EQ(b->get("k", 1s), (std::vector<char>{'v', '1'}));
  EXPECT_EQ(a->add("n", 2), 2);
  EXPECT_EQ(b->add("n", 3), 5);
  EXPECT_TRUE(b->check("k"));
  EXPECT_FALSE(b->check("missing"));
  std::thread later([&] {
    std::this_thread::sleep_for(100ms);
    a->set("late", {'x'});
  });
  EXPECT_EQ(b->get("late", 5s), (std::vector<char>{'x'}));
  later.join();
  EXPECT_THROW(b->get("never", 200ms), Timeout);
  EXPECT_EQ(server->refusedCount(), 0);
}

TEST(TcpStore, RequestsWithoutTheSecretAreRefused) {
  auto server = startTcpStoreServer("127.0.0.1", 0, "right");
  auto good = connectTcpStore("127.0.0.1", server->port(), "right", 5s);
  good->set("k", {'1'});
  for (const char* secret : {"wrong", ""}) {
    auto bad = connectTcpStore("127.0.0.1", server->port(), secret, 5s);
    try {
      bad->get("k", 1s);
      ADD_FAILURE() << "request with secret '" << secret << "' was served";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("refused"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(server->refusedCount(), 2);
  EXPECT_EQ(good->get("k", 1s), (std::vector<char>{'1'}));
}

TEST(TcpStore, RanksRendezvousThroughIt) {
  auto server = startTcpStoreServer("127.0.0.1", 0, "job");
  std::vector<std::thread> ranks;
  std::vector<double> results(3, -1);
  for (int r = 0; r < 3; ++r) {
    ranks.emplace_back([&, r] {
      Runtime rt;
      Config c;
      c.rank = r;
      c.size = 3;
      c.rendezvousAddr = "127.0.0.1";
      c.rendezvousPort = server->port();
      c.secret = "job";
      c.hostname = r < 2 ? "hostA" : "hostB";
      rt.init(c);
      float v = 1.0f + r;
      AllreduceOptions o;
      o.op = ReduceOp::kSum;
      rt.allreduce(Tensor{&v, DataType::kFloat32, {1}}, Tensor{&v, DataType::kFloat32, {1}}, o);
      results[r] = v;
      // Topology from host names: hostA has ranks 0,1; hostB has rank 2.
      EXPECT_EQ(rt.localSize(), r < 2 ? 2 : 1);
      EXPECT_EQ(rt.localRank(), r < 2 ? r : 0);
      EXPECT_EQ(rt.crossSize(), r == 1 ? 1 : 2);
      EXPECT_EQ(rt.crossRank(), r == 2 ? 1 : 0);
      EXPECT_FALSE(rt.isHomogeneous());
      rt.shutdown();
    });
  }
  for (auto& t : ranks) t.join();
  for (double v : results) EXPECT_EQ(v, 6);
}

TEST(MemoryStore, Basics) {
  auto s = makeMemoryStore();
  s->set("a", {'1'});
  EXPECT_EQ(s->get("a", 10ms), (std::vector<char>{'1'}));
  EXPECT_THROW(s->get("b", 10ms), Timeout);
  EXPECT_EQ(s->add("c", 4), 4);
}

}  // namespace
}  // namespace chorus
