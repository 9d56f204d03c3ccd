#include "comm/gloo/direct_mesh.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <sstream>

#include "chorus/error.h"
#include "chorus/store.h"
#include "comm/tcp_listen.h"
#include "base/wire.h"

namespace chorus {

namespace {

constexpr uint32_t kHello = 0x63686d31;

struct Header {
  uint32_t bytes;
  uint32_t seq;
};

}  // namespace

DirectMesh::DirectMesh(Store& store, const std::string& prefix, int rank, int size, const std::string& host,
                       const std::string& iface, std::chrono::milliseconds connectTimeout,
                       std::chrono::milliseconds timeout, std::vector<int> names)
    : rank_(rank), fds_(size, -1), timeout_(timeout), names_(std::move(names)) {
  const auto deadline = std::chrono::steady_clock::now() + connectTimeout;
  std::string addr;
  int port = 0;
  const int lfd = tcpListen(host, iface, size, &addr, &port);
  auto key = [&](int r) { return prefix + "direct/" + std::to_string(r); };
  const std::string mine = addr + " " + std::to_string(port);
  try {
    store.set(key(rank), std::vector<char>(mine.begin(), mine.end()));
    // Lower ranks listen for higher ones: each rank connects down, accepts up.
    for (int peer = 0; peer < rank; ++peer) {
      const std::vector<char> v = store.get(key(peer), connectTimeout);
      std::istringstream in(std::string(v.begin(), v.end()));
      std::string peerAddr;
      int peerPort = 0;
      in >> peerAddr >> peerPort;
      fds_[peer] = rendezvous::connectWithRetry(peerAddr, peerPort, std::chrono::milliseconds(msLeft(deadline)),
                                                who(peer) + " of a TCP group");
      const uint32_t hello[2] = {kHello, static_cast<uint32_t>(rank)};
      if (::send(fds_[peer], hello, sizeof(hello), MSG_NOSIGNAL) != sizeof(hello))
        throw PeerFailure("peer failure: " + who(peer) + " closed its TCP connection while connecting");
    }
    for (int missing = size - 1 - rank; missing > 0;) {
      if (!tcpReady(lfd, POLLIN, msLeft(deadline)))
        throw Timeout("timed out after " + std::to_string(connectTimeout.count()) + " ms waiting for " +
                      std::to_string(missing) + " higher rank(s) of a TCP group to connect");
      const int fd = ::accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      uint32_t hello[2] = {0, 0};
      const bool got = tcpReady(fd, POLLIN, msLeft(deadline)) && ::recv(fd, hello, sizeof(hello), MSG_WAITALL) == sizeof(hello);
      const int peer = static_cast<int>(hello[1]);
      if (!got || hello[0] != kHello || peer <= rank || peer >= size || fds_[peer] >= 0) {
        ::close(fd);  // not one of ours: keep waiting for the real peers
        continue;
      }
      fds_[peer] = fd;
      --missing;
    }
  } catch (...) {
    ::close(lfd);
    for (int fd : fds_)
      if (fd >= 0) ::close(fd);
    throw;
  }
  ::close(lfd);
  for (int fd : fds_) {
    if (fd < 0) continue;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  }
}

void DirectMesh::abort() {
  for (int fd : fds_)
    if (fd >= 0) ::shutdown(fd, SHUT_RDWR);
}

DirectMesh::~DirectMesh() {
  for (int fd : fds_)
    if (fd >= 0) ::close(fd);
}

void DirectMesh::fail(const std::string& why, bool timeout) {
  broken_ = why;
  if (timeout) throw Timeout(why);
  throw PeerFailure(why);
}

void DirectMesh::run(const std::vector<Transfer>& sends, const std::vector<Transfer>& recvs) {
  if (!broken_.empty()) throw PeerFailure("the TCP group failed before: " + broken_);
  const uint32_t seq = seq_++;
  struct Op {
    Transfer t;
    bool sending;
    Header hdr;  // to send, or as received
    size_t done = 0;  // of header and data
  };
  std::vector<Op> ops;
  ops.reserve(sends.size() + recvs.size());
  for (const auto& t : sends) ops.push_back({t, true, {static_cast<uint32_t>(t.bytes), seq}});
  for (const auto& t : recvs) ops.push_back({t, false, {0, 0}});
  // Names for errors only: built when one happens.
  // Moves one op forward as far as its socket allows; true once it is complete.
  auto step = [&](Op& op) {
    const size_t total = sizeof(Header) + op.t.bytes;
    while (op.done < total) {
      iovec iov[2];
      int n = 0;
      if (op.done < sizeof(Header)) iov[n++] = {reinterpret_cast<char*>(&op.hdr) + op.done, sizeof(Header) - op.done};
      const size_t dataDone = op.done > sizeof(Header) ? op.done - sizeof(Header) : 0;
      if (op.t.bytes > dataDone) iov[n++] = {op.t.data + dataDone, op.t.bytes - dataDone};
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = n;
      const int fd = fds_[op.t.peer];
      const ssize_t r = op.sending ? ::sendmsg(fd, &msg, MSG_NOSIGNAL) : ::recvmsg(fd, &msg, 0);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return false;
      if (r <= 0) {
        const std::string why = r < 0 ? " (" + std::string(std::strerror(errno)) + ")" : "";
        fail("peer failure: " + who(op.t.peer) + " closed its TCP connection to " + who(rank_) + why, false);
      }
      const bool hadHeader = op.done >= sizeof(Header);
      op.done += static_cast<size_t>(r);
      if (!op.sending && !hadHeader && op.done >= sizeof(Header) &&
          (op.hdr.bytes != op.t.bytes || op.hdr.seq != seq)) {
        broken_ = who(op.t.peer) + " sent " + who(rank_) + " a message of " + std::to_string(op.hdr.bytes) + " bytes (message " +
                  std::to_string(op.hdr.seq) + ") where " + std::to_string(op.t.bytes) + " bytes (message " +
                  std::to_string(seq) + ") were due: the ranks ran different collectives";
        throw Error(broken_);
      }
    }
    return true;
  };
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  std::vector<pollfd> polls;
  std::vector<Op*> pending;
  while (true) {
    polls.clear();
    pending.clear();
    for (auto& op : ops) {
      if (op.done == sizeof(Header) + op.t.bytes || step(op)) continue;
      polls.push_back({fds_[op.t.peer], static_cast<short>(op.sending ? POLLOUT : POLLIN), 0});
      pending.push_back(&op);
    }
    if (polls.empty()) return;
    int rc;
    do rc = ::poll(polls.data(), polls.size(), msLeft(deadline)); while (rc < 0 && errno == EINTR);
    if (rc == 0) {
      std::string late;
      for (const Op* op : pending)
        late += (late.empty() ? "" : ", ") + std::to_string(names_.empty() ? op->t.peer : names_.at(op->t.peer));
      fail(who(rank_) + " timed out after " + std::to_string(timeout_.count()) + " ms waiting for rank(s) " + late +
               " (stopped, or too slow: CHORUS_TIMEOUT_SECONDS)",
           true);
    }
  }
}

}  // namespace chorus
