// The direct TCP mesh that carries small collectives: messages pair up by peer
// and order, large ones survive partial writes, and a dead, silent or
// out-of-step peer is an error on the others, never a hang.
#include "comm/gloo/direct_mesh.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "chorus/error.h"
#include "chorus/store.h"
#include "base/wire.h"

namespace chorus {
namespace {

using std::chrono::milliseconds;

// Builds one mesh per rank (threads), then runs fn(rank, mesh) on each; returns the errors.
std::vector<std::string> withMeshes(int n, milliseconds timeout,
                                    const std::function<void(int, std::unique_ptr<DirectMesh>&)>& fn,
                                    const std::string& iface = "") {
  auto store = makeMemoryStore();
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        // With an interface the host must not matter: an unresolvable one proves it.
        const std::string host = iface.empty() ? "127.0.0.1" : "chorus-unresolvable.invalid";
        auto mesh = std::make_unique<DirectMesh>(*store, "t/", r, n, host, iface, milliseconds(10000), timeout);
        fn(r, mesh);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

char valueOf(int from, int to, int round, size_t i) { return static_cast<char>(from * 31 + to * 7 + round + i % 251); }

TEST(DirectMesh, EveryPairExchangesInOrderSmallEmptyAndLarge) {
  const int n = 3;
  // 24 MiB is far beyond what the sockets buffer: sends and receives must interleave.
  const std::vector<size_t> sizes = {8, 0, 24 << 20, 1, 65536};
  auto errors = withMeshes(n, milliseconds(20000), [&](int me, std::unique_ptr<DirectMesh>& mesh) {
    for (size_t round = 0; round < sizes.size(); ++round) {
      const size_t bytes = sizes[round];
      std::vector<std::vector<char>> out(n, std::vector<char>(bytes)), in(n, std::vector<char>(bytes, 0));
      std::vector<DirectMesh::Transfer> sends, recvs;
      for (int p = 0; p < n; ++p) {
        if (p == me) continue;
        for (size_t i = 0; i < bytes; ++i) out[p][i] = valueOf(me, p, static_cast<int>(round), i);
        sends.push_back({p, out[p].data(), bytes});
        recvs.push_back({p, in[p].data(), bytes});
      }
      mesh->run(sends, recvs);
      for (int p = 0; p < n; ++p) {
        if (p == me) continue;
        for (size_t i = 0; i < bytes; ++i)
          ASSERT_EQ(in[p][i], valueOf(p, me, static_cast<int>(round), i)) << "from " << p << " round " << round;
      }
    }
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

TEST(DirectMesh, APeerThatClosesIsAPeerFailure) {
  auto errors = withMeshes(2, milliseconds(20000), [](int me, std::unique_ptr<DirectMesh>& mesh) {
    if (me == 1) {
      mesh.reset();  // closes its connections
      return;
    }
    char buf[8];
    try {
      mesh->run({}, {{1, buf, sizeof(buf)}});
      ADD_FAILURE() << "no error from a closed peer";
    } catch (const Timeout&) {
      ADD_FAILURE() << "a timeout instead of a peer failure";
    } catch (const PeerFailure& e) {
      EXPECT_NE(std::string(e.what()).find("rank 1 closed its TCP connection"), std::string::npos) << e.what();
    }
  });
  EXPECT_EQ(errors[0], "");
}

TEST(DirectMesh, ASilentPeerIsATimeoutAndTheMeshRefusesFurtherUse) {
  auto errors = withMeshes(2, milliseconds(300), [](int me, std::unique_ptr<DirectMesh>& mesh) {
    if (me == 1) {
      std::this_thread::sleep_for(milliseconds(1500));  // never sends
      return;
    }
    char buf[8];
    const auto start = std::chrono::steady_clock::now();
    EXPECT_THROW(mesh->run({}, {{1, buf, sizeof(buf)}}), Timeout);
    EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(1400));
    try {
      mesh->run({{1, buf, sizeof(buf)}}, {});
      ADD_FAILURE() << "a failed mesh was used again";
    } catch (const PeerFailure& e) {
      EXPECT_NE(std::string(e.what()).find("failed before"), std::string::npos) << e.what();
    }
  });
  EXPECT_EQ(errors[0], "");
}

TEST(DirectMesh, AMessageOfAnotherSizeIsReportedAsRanksOutOfStep) {
  auto errors = withMeshes(2, milliseconds(5000), [](int me, std::unique_ptr<DirectMesh>& mesh) {
    char buf[16] = {0};
    if (me == 1) {
      mesh->run({{0, buf, 16}}, {});
      return;
    }
    mesh->run({}, {{1, buf, 8}});
  });
  EXPECT_NE(errors[0].find("sent rank 0 a message of 16 bytes"), std::string::npos) << errors[0];
  EXPECT_NE(errors[0].find("different collectives"), std::string::npos) << errors[0];
  EXPECT_EQ(errors[1], "");
}

TEST(DirectMesh, ListensOnANamedInterface) {
  std::vector<char> got(2, 0);
  auto errors = withMeshes(2, milliseconds(5000), [&](int me, std::unique_ptr<DirectMesh>& mesh) {
    char mine = static_cast<char>(20 + me);
    mesh->run({{1 - me, &mine, 1}}, {{1 - me, &got[me], 1}});
  }, "lo");
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
  EXPECT_EQ(got[0], 21);
  EXPECT_EQ(got[1], 20);
}

TEST(DirectMesh, AnInterfaceWithoutAnAddressIsAClearError) {
  auto store = makeMemoryStore();
  try {
    DirectMesh mesh(*store, "u/", 0, 2, "127.0.0.1", "chorus-none0", milliseconds(1000), milliseconds(1000));
    FAIL() << "no error for a missing interface";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("network interface 'chorus-none0' has no IP address"), std::string::npos)
        << e.what();
  }
}

// Connections to a rank's listening port that do not introduce themselves as a
// member (wrong greeting, or none) are dropped; the real peer still gets in.
TEST(DirectMesh, ConnectionsFromStrangersAreIgnored) {
  auto store = makeMemoryStore();
  std::vector<std::string> errors(2);
  std::vector<char> got(2, 0);
  auto rankThread = [&](int r) {
    return std::thread([&, r] {
      try {
        DirectMesh mesh(*store, "s/", r, 2, "127.0.0.1", "", milliseconds(10000), milliseconds(5000));
        char mine = static_cast<char>(10 + r);
        mesh.run({{1 - r, &mine, 1}}, {{1 - r, &got[r], 1}});
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  };
  std::thread r0 = rankThread(0);
  {
    const std::vector<char> v = store->get("s/direct/0", milliseconds(10000));
    std::istringstream in(std::string(v.begin(), v.end()));
    std::string host;
    int port = 0;
    in >> host >> port;
    const int wrong = rendezvous::connectWithRetry(host, port, milliseconds(5000), "rank 0");
    const uint32_t junk[2] = {0xdeadbeef, 1};
    ASSERT_EQ(::send(wrong, junk, sizeof(junk), MSG_NOSIGNAL), static_cast<ssize_t>(sizeof(junk)));
    const int silent = rendezvous::connectWithRetry(host, port, milliseconds(5000), "rank 0");
    ::close(silent);
    ::close(wrong);
  }
  std::thread r1 = rankThread(1);
  r0.join();
  r1.join();
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
  EXPECT_EQ(got[0], 11);
  EXPECT_EQ(got[1], 10);
}

}  // namespace
}  // namespace chorus
