// The rendezvous store: TCP client/server with the job secret, and the in-memory store.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
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

// Sends raw bytes to the store as a stranger would and waits for it to hang up.
void sendRaw(int port, const std::string& bytes) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  char buf[256];
  while (::read(fd, buf, sizeof(buf)) > 0) {
  }
  ::close(fd);
}

std::string frame(const std::string& payload) {
  uint32_t n = static_cast<uint32_t>(payload.size());
  return std::string(reinterpret_cast<const char*>(&n), 4) + payload;
}

TEST(TcpStore, LogsEachRefusedConnectionAtMostOnceASecond) {
  auto server = startTcpStoreServer("127.0.0.1", 0, "right");
  ::testing::internal::CaptureStderr();
  sendRaw(server->port(), frame("\x02"));  // an op byte and then nothing: not a store request
  sendRaw(server->port(), std::string("\xff\xff\xff\x7f", 4));  // announces a 2 GiB frame
  for (int i = 0; i < 3; ++i) {
    auto bad = connectTcpStore("127.0.0.1", server->port(), "wrong", 5s);
    EXPECT_THROW(bad->get("k", 1s), InvalidArgument);
  }
  std::this_thread::sleep_for(1100ms);
  auto none = connectTcpStore("127.0.0.1", server->port(), "", 5s);
  EXPECT_THROW(none->check("k"), InvalidArgument);
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(server->refusedCount(), 6);
  // The first refusal is logged with the peer and the reason; the next four fall
  // within the same second; the one after the pause says how many went unlogged.
  EXPECT_NE(log.find("[chorus WARNING] chorus store: refused a connection from 127.0.0.1:"), std::string::npos) << log;
  EXPECT_NE(log.find("a malformed request"), std::string::npos) << log;
  EXPECT_EQ(log.find("wrong job secret"), std::string::npos) << log;
  EXPECT_NE(log.find("no job secret (request for key 'k') (and 4 more refused since the last line)"),
            std::string::npos)
      << log;
  int lines = 0;
  for (char c : log) lines += c == '\n';
  EXPECT_EQ(lines, 2) << log;
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
