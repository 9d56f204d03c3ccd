// The rendezvous store: TCP client/server with the job secret, and the in-memory store.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <dirent.h>
#include <poll.h>
#include <unistd.h>

#include <cstring>
#include <thread>

#include "chorus/chorus.h"
#include "base/net_address.h"

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

TEST(TcpStore, ConnectionsWithoutTheSecretAreRefused) {
  auto server = startTcpStoreServer("127.0.0.1", 0, "right");
  auto good = connectTcpStore("127.0.0.1", server->port(), "right", 5s);
  good->set("k", {'1'});
  for (const char* secret : {"wrong", ""}) {
    try {
      connectTcpStore("127.0.0.1", server->port(), secret, 5s);
      ADD_FAILURE() << "a connection with secret '" << secret << "' was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("refused"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(server->refusedCount(), 2);
  EXPECT_EQ(good->get("k", 1s), (std::vector<char>{'1'}));
}

// A stranger's socket to the store.
int connectRaw(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  return fd;
}

// Sends raw bytes to the store as a stranger would and waits for it to hang up.
void sendRaw(int port, const std::string& bytes) {
  const int fd = connectRaw(port);
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

// Whether the store has closed fd (it reads EOF within the wait).
bool closedByStore(int fd, std::chrono::milliseconds wait) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(wait.count())) <= 0) return false;
  char c;
  return ::read(fd, &c, 1) <= 0;
}

int countEntries(const char* dir) {
  int n = 0;
  if (DIR* d = opendir(dir)) {
    while (readdir(d)) ++n;
    closedir(d);
  }
  return n;
}

TEST(TcpStore, StrangersGetNothingBeforeTheHandshake) {
  StoreServerOptions o;
  o.handshakeSeconds = 0.5;
  auto server = startTcpStoreServer("127.0.0.1", 0, "right", o);
  // Frames announced at 256 MiB and 2 GiB are refused at the announcement: nothing is allocated for them.
  for (const char* big : {"\x00\x00\x00\x10", "\xff\xff\xff\x7f"}) {
    const int fd = connectRaw(server->port());
    ASSERT_EQ(::write(fd, big, 4), 4);
    ASSERT_EQ(::write(fd, "x", 1), 1);
    EXPECT_TRUE(closedByStore(fd, 2000ms)) << "an oversized announcement kept its connection";
    ::close(fd);
  }
  // A request before the handshake is a malformed handshake.
  sendRaw(server->port(), frame(std::string("\x02\x05right\x01k", 9)));
  EXPECT_EQ(server->refusedCount(), 3);
  auto good = connectTcpStore("127.0.0.1", server->port(), "right", 5s);
  good->set("k", {'1'});
  EXPECT_EQ(good->get("k", 1s), (std::vector<char>{'1'}));
}

// The hello a client sends: [u32 length][kHello][u32 length]secret.
std::string helloFrame(const std::string& secret) {
  const uint32_t n = static_cast<uint32_t>(secret.size());
  return frame("\x05" + std::string(reinterpret_cast<const char*>(&n), 4) + secret);
}

TEST(TcpStore, AHandshakeTricklingPastTheDeadlineIsCut) {
  StoreServerOptions o;
  o.handshakeSeconds = 1;
  auto server = startTcpStoreServer("127.0.0.1", 0, "right", o);
  ::testing::internal::CaptureStderr();
  // A right hello (14 bytes, its header announcing 10: well within the 4 KiB
  // limit), its header at once, then its body a byte every 200 ms: the whole
  // would take 2 s, the deadline cuts it at 1 s, though bytes keep coming.
  const std::string hello = helloFrame("right");
  ASSERT_EQ(hello.size(), 14u);
  const int slow = connectRaw(server->port());
  const auto start = std::chrono::steady_clock::now();
  ASSERT_EQ(::send(slow, hello.data(), 4, MSG_NOSIGNAL), 4);
  size_t sent = 4;
  bool closed = closedByStore(slow, 200ms);
  while (!closed && sent < hello.size()) {
    (void)!::send(slow, hello.data() + sent++, 1, MSG_NOSIGNAL);
    closed = closedByStore(slow, 200ms);
  }
  const auto cutAfter = std::chrono::steady_clock::now() - start;
  ::close(slow);
  std::this_thread::sleep_for(100ms);
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(closed) << "a trickled handshake was admitted after " << sent << " bytes";
  EXPECT_LT(sent, hello.size()) << "the whole handshake arrived before the store cut it";
  EXPECT_GE(cutAfter, 900ms) << "cut before its deadline";
  EXPECT_LT(cutAfter, 1900ms);
  EXPECT_EQ(server->refusedCount(), 1);
  EXPECT_NE(log.find("no handshake within 1 s"), std::string::npos) << log;
  EXPECT_EQ(log.find("a frame of"), std::string::npos) << log;
  // The store goes on: the same hello at once is admitted.
  auto good = connectTcpStore("127.0.0.1", server->port(), "right", 5s);
  good->set("k", {'1'});
  EXPECT_EQ(good->get("k", 1s), (std::vector<char>{'1'}));
}

TEST(TcpStore, ConnectionsAreReleasedAndStrangersAreBounded) {
  StoreServerOptions o;
  o.handshakeSeconds = 30;  // strangers that stay: only the bound removes them
  o.maxPending = 8;
  auto server = startTcpStoreServer("127.0.0.1", 0, "right", o);
  auto warm = connectTcpStore("127.0.0.1", server->port(), "right", 5s);
  warm->set("w", {'1'});
  const int fds = countEntries("/proc/self/fd"), threads = countEntries("/proc/self/task");
  // 2,000 short-lived connections, half authenticated and closed, half strangers that connect and close.
  for (int i = 0; i < 1000; ++i) {
    { auto c = connectTcpStore("127.0.0.1", server->port(), "right", 5s); c->check("w"); }
    ::close(connectRaw(server->port()));
  }
  // 50 strangers that stay: at most maxPending are held, the oldest closed first.
  std::vector<int> stay;
  for (int i = 0; i < 50; ++i) stay.push_back(connectRaw(server->port()));
  int closedCount = 0;
  for (int fd : stay) closedCount += closedByStore(fd, 200ms);
  EXPECT_GE(closedCount, 50 - o.maxPending);
  // A rank arriving now still gets in, and the job goes on.
  auto late = connectTcpStore("127.0.0.1", server->port(), "right", 5s);
  EXPECT_EQ(late->get("w", 1s), (std::vector<char>{'1'}));
  for (int fd : stay) ::close(fd);
  late.reset();
  std::this_thread::sleep_for(500ms);  // the store reaps what closed
  EXPECT_LE(countEntries("/proc/self/fd"), fds + 2);
  EXPECT_LE(countEntries("/proc/self/task"), threads + 1);
  EXPECT_EQ(server->connectionCount(), 1);  // warm
}

TEST(TcpStore, LogsTheFirstRefusalPerAddressThenSummaries) {
  StoreServerOptions o;
  o.summarySeconds = 0.5;
  auto server = startTcpStoreServer("127.0.0.1", 0, "right", o);
  ::testing::internal::CaptureStderr();
  sendRaw(server->port(), std::string("\xff\xff\xff\x7f", 4));  // announces a 2 GiB frame
  for (int i = 0; i < 3; ++i) EXPECT_THROW(connectTcpStore("127.0.0.1", server->port(), "wrong", 5s), InvalidArgument);
  std::this_thread::sleep_for(800ms);
  ::close(connectRaw(server->port()));  // connects and closes: counted too
  std::this_thread::sleep_for(800ms);
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(server->refusedCount(), 5);
  EXPECT_NE(log.find("[chorus WARNING] chorus store: refused a connection from 127.0.0.1:"), std::string::npos) << log;
  EXPECT_NE(log.find("a frame of 2147483647 bytes before authenticating"), std::string::npos) << log;
  EXPECT_NE(log.find("refused 3 more from 127.0.0.1 in the last"), std::string::npos) << log;
  EXPECT_NE(log.find("(the last: wrong job secret)"), std::string::npos) << log;
  EXPECT_NE(log.find("refused 1 more from 127.0.0.1 in the last"), std::string::npos) << log;
  EXPECT_NE(log.find("closed without a handshake"), std::string::npos) << log;
  int lines = 0;
  for (char c : log) lines += c == '\n';
  EXPECT_EQ(lines, 3) << log;
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

// Listens on a kernel-picked port and never answers: connections complete in
// its backlog, hellos go unanswered (a stranger on a candidate port).
int silentListener(int* port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  EXPECT_EQ(::listen(fd, 16), 0);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  *port = ntohs(a.sin_port);
  return fd;
}

// Rank 0 serves on a port every rank derives (MASTER_PORT+1 under torchrun);
// when others have it, rank 0 takes the next candidate and the ranks find it.
TEST(TcpStore, ADerivedPortTakenByOthersMovesToTheNextCandidate) {
  auto otherJob = startTcpStoreServer("127.0.0.1", 0, "another job's secret");
  int strangerPort = 0;
  const int stranger = silentListener(&strangerPort);
  net::HeldPort held = net::holdFreePort();  // bound, not listening: another job's MASTER_PORT
  net::HeldPort ours = net::holdFreePort();
  const std::vector<int> ports{otherJob->port(), strangerPort, held.port(), ours.port()};
  // Rank 1 starts looking before rank 0 listens.
  std::shared_ptr<Store> rank1;
  std::string rank1Error;
  std::thread looking([&] {
    try {
      rank1 = connectTcpStoreOnFirstOf("127.0.0.1", ports, "job", 30s);
    } catch (const std::exception& e) {
      rank1Error = e.what();
    }
  });
  std::this_thread::sleep_for(300ms);
  ours.release();
  auto server = startTcpStoreServerOnFirstFree("127.0.0.1", ports, "job");
  EXPECT_EQ(server->port(), ports[3]);
  looking.join();
  ASSERT_TRUE(rank1) << rank1Error;
  rank1->set("k", {'1'});
  auto rank0 = connectTcpStore("127.0.0.1", server->port(), "job", 5s);
  EXPECT_EQ(rank0->get("k", 1s), (std::vector<char>{'1'}));
  EXPECT_GE(otherJob->refusedCount(), 1);  // rank 1 asked there first, and was turned away
  EXPECT_EQ(otherJob->connectionCount(), 0);
  // The held port stayed its owner's: its server (SO_REUSEADDR) can still listen there.
  const int owner = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int one = 1;
  setsockopt(owner, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(held.port()));
  EXPECT_EQ(::bind(owner, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0) << std::strerror(errno);
  EXPECT_EQ(::listen(owner, 8), 0) << std::strerror(errno);
  ::close(owner);
  ::close(stranger);
}

TEST(TcpStore, ARestartedStoreGetsItsPortBackFromTimeWait) {
  // A re-init under torchrun: the same candidates, the first left in TIME_WAIT by the
  // store that just closed. It is this job's to take again, not a reason to move on.
  net::HeldPort first = net::holdFreePort(), second = net::holdFreePort();
  const std::vector<int> ports{first.port(), second.port()};
  first.release();
  second.release();
  {
    auto server = startTcpStoreServerOnFirstFree("127.0.0.1", ports, "job");
    ASSERT_EQ(server->port(), ports[0]);
    auto client = connectTcpStore("127.0.0.1", server->port(), "job", 5s);
    client->set("k", {'1'});
    server.reset();  // the server closes first: its side of the connection waits in TIME_WAIT
  }
  ASSERT_TRUE(net::onlyTimeWaitOn(ports[0])) << "the test needs port " << ports[0] << " in TIME_WAIT";
  auto again = startTcpStoreServerOnFirstFree("127.0.0.1", ports, "job");
  EXPECT_EQ(again->port(), ports[0]);
}

TEST(TcpStore, EveryCandidateTakenIsAnErrorNamingThem) {
  auto otherJob = startTcpStoreServer("127.0.0.1", 0, "another job's secret");
  net::HeldPort held = net::holdFreePort();
  try {
    startTcpStoreServerOnFirstFree("127.0.0.1", {otherJob->port(), held.port()}, "job");
    ADD_FAILURE() << "a store listened on a taken port";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("every candidate port is in use"), std::string::npos) << what;
    EXPECT_NE(what.find(std::to_string(otherJob->port())), std::string::npos) << what;
    EXPECT_NE(what.find(std::to_string(held.port())), std::string::npos) << what;
  }
  // A client finds no store of its job there, and says what it met at each port.
  try {
    connectTcpStoreOnFirstOf("127.0.0.1", {otherJob->port(), held.port()}, "job", 1s);
    ADD_FAILURE() << "a client settled on another job's store";
  } catch (const Timeout& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("port " + std::to_string(otherJob->port()) + ": the rendezvous store"), std::string::npos)
        << what;
    EXPECT_NE(what.find("wrong job secret"), std::string::npos) << what;
    EXPECT_NE(what.find("port " + std::to_string(held.port()) + ": could not connect"), std::string::npos) << what;
  }
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
