#include "comm/p2p/socket_p2p.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <random>
#include <sstream>

#include "chorus/error.h"
#include "chorus/store.h"
#include "comm/p2p/p2p_sockets.h"
#include "comm/tcp_listen.h"

namespace chorus::p2p {

namespace {

// Up to this, a send travels with its header and the sender is done once the
// receiver says so; beyond, it waits for the receiver's recv (no unbounded
// buffering of unexpected data).
constexpr size_t kEagerMax = 64 << 10;

std::string who(int r) { return "rank " + std::to_string(r); }

std::string describe(const P2pRequest& r, int me) {
  std::ostringstream s;
  s << who(me) << (r.send ? " sending " : " receiving ") << r.bytes << " bytes (" << dtypeName(r.dtype)
    << ") with tag " << r.tag << " in process set " << r.processSet << (r.send ? " to " : " from ") << who(r.peer);
  return s.str();
}

// Reads a peer's memory (cross-memory attach); 0 or the errno.
int readPeerMemory(pid_t pid, uint64_t addr, void* dst, size_t bytes) {
  size_t done = 0;
  while (done < bytes) {
    iovec local{static_cast<char*>(dst) + done, bytes - done};
    iovec remote{reinterpret_cast<void*>(addr + done), bytes - done};
    const ssize_t n = process_vm_readv(pid, &local, 1, &remote, 1, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return n < 0 ? errno : EFAULT;
    done += static_cast<size_t>(n);
  }
  return 0;
}

// The machine's cores (a launcher may have bound each rank to one of them).
int usableCores() { return static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN))); }

}  // namespace

// The kCts that asks the sender to hand its payload to bulk_ instead of the connection.
constexpr uint64_t kViaBulk = 1;

SocketP2p::SocketP2p(Store& store, const std::string& prefix, int rank, const std::vector<std::string>& hosts,
                     const P2pOptions& opts, std::unique_ptr<P2pBulk> bulk)
    : rank_(rank), hosts_(hosts), opts_(opts), store_(store), prefix_(prefix + "p2p/"), bulk_(std::move(bulk)) {
  peers_.resize(hosts.size());
  connected_.reset(new std::atomic<bool>[hosts.size()]);
  for (size_t r = 0; r < hosts.size(); ++r) connected_[r] = false;
  int local = 0;
  for (size_t r = 0; r < hosts.size(); ++r) {
    peers_[r].sameHost = hosts[r] == hosts[rank];
    local += peers_[r].sameHost ? 1 : 0;
  }
  // Spinning pays only while every rank of the host has a core of its own.
  spin_ = std::chrono::microseconds(local > usableCores() ? 0 : 200);
  std::string addr;
  int port = 0;
  listenFd_ = tcpListen(opts.bindAddress.empty() ? "127.0.0.1" : opts.bindAddress, opts.iface, 128, &addr, &port);
  fcntl(listenFd_, F_SETFL, fcntl(listenFd_, F_GETFL) | O_NONBLOCK);
  wakeFd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  try {
    // A hello must carry the job's token: connections from elsewhere are dropped.
    if (rank == 0) {
      token_ = std::random_device{}() | (static_cast<uint64_t>(std::random_device{}()) << 32);
      const char* t = reinterpret_cast<const char*>(&token_);
      store.set(prefix_ + "token", std::vector<char>(t, t + sizeof(token_)));
    } else {
      const auto v = store.get(prefix_ + "token", opts.connectTimeout);
      if (v.size() == sizeof(token_)) std::memcpy(&token_, v.data(), sizeof(token_));
    }
    localFd_ = listenLocal(token_, rank);  // (none: same-host peers use TCP)
    const std::string mine = addr + " " + std::to_string(port) + " " + (localFd_ >= 0 ? "1" : "0");
    store.set(prefix_ + std::to_string(rank), std::vector<char>(mine.begin(), mine.end()));
  } catch (...) {
    if (localFd_ >= 0) ::close(localFd_);
    ::close(listenFd_);
    ::close(wakeFd_);
    throw;
  }
  bg_ = std::thread([this] { background(); });
}

SocketP2p::~SocketP2p() {
  shutdown();
  ::close(listenFd_);
  if (localFd_ >= 0) ::close(localFd_);
  ::close(wakeFd_);
}

void SocketP2p::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return;
    stopped_ = true;
    stopping_ = true;
    for (size_t r = 0; r < peers_.size(); ++r) {
      Peer& p = peers_[r];
      for (auto& [id, op] : p.sends)
        op.req.done(std::make_exception_ptr(ShutdownError("chorus was shut down while " + describe(op.req, rank_))));
      for (auto& op : p.recvs)
        op.req.done(std::make_exception_ptr(ShutdownError("chorus was shut down while " + describe(op.req, rank_))));
      p.sends.clear();
      p.recvs.clear();
      p.early.clear();
      p.readingSet = false;
    }
    pending_ = 0;
    bulkInFlight_ = 0;
    for (auto& l : links_) {
      // The accepting rank removes a pair's segment name when it maps it; one that
      // never did (it left first) must not leave the name behind.
      if (l->outgoing() && l->hasRings()) shm_unlink(ringName(rank_, l->peer()).c_str());
      l->close();
    }
  }
  const uint64_t one = 1;
  (void)!::write(wakeFd_, &one, sizeof(one));
  {
    std::lock_guard<std::mutex> wake(bgMu_);
    bgCv_.notify_all();
  }
  if (bg_.joinable()) bg_.join();
}

void SocketP2p::kick() {
  if (sleepers_.load() == 0) return;
  const uint64_t one = 1;
  (void)!::write(wakeFd_, &one, sizeof(one));
}

std::string SocketP2p::ringName(int from, int to) const {
  return "/chorus-" + opts_.jobId + "-p2p-" + std::to_string(token_) + "-" + std::to_string(from) + "-" +
         std::to_string(to);
}

void SocketP2p::connectTo(int peer) {
  if (connected_[peer].load()) return;
  std::lock_guard<std::mutex> one(connectMu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (peers_[peer].out || !peers_[peer].failed.empty()) return;
  }
  std::string addr, why;
  int port = 0, local = 0;
  try {
    const auto v = store_.get(prefix_ + std::to_string(peer), opts_.connectTimeout);
    std::istringstream in(std::string(v.begin(), v.end()));
    in >> addr >> port >> local;
  } catch (const Timeout&) {
    throw PeerFailure("peer failure: " + who(peer) + " never published its point-to-point address");
  }
  int fd = local && peers_[peer].sameHost && localFd_ >= 0 ? connectLocal(token_, peer) : -1;
  // Within the host, frames go through shared memory; the connection stays as the doorbell.
  std::unique_ptr<RingPair> rings(fd >= 0 && opts_.sharedMemoryRings ? RingPair::create(ringName(rank_, peer)) : nullptr);
  if (fd < 0) fd = connectOnce(addr, port, opts_.connectTimeout, &why);
  if (fd < 0)
    throw PeerFailure("peer failure: " + who(rank_) + " cannot connect to " + who(peer) + " at " + addr + ":" +
                      std::to_string(port) + " for point-to-point (" + why + ")");
  const Frame hello{Kind::kHello, rings ? 1 : 0, rank_, 0, static_cast<uint64_t>(getpid()), 0, token_};
  if (!writeAll(fd, &hello, sizeof(hello), opts_.connectTimeout)) {
    ::close(fd);
    if (rings) shm_unlink(ringName(rank_, peer).c_str());
    throw PeerFailure("peer failure: " + who(peer) + " closed its point-to-point connection from " + who(rank_));
  }
  setNonBlocking(fd);
  std::lock_guard<std::mutex> lock(mu_);
  links_.push_back(std::make_unique<Link>(fd, peer, true));
  if (rings) links_.back()->useRings(std::move(rings), true);
  peers_[peer].out = links_.back().get();
  connected_[peer] = true;
  kick();
}

void SocketP2p::post(std::vector<P2pRequest> ops) {
  const int n = static_cast<int>(peers_.size());
  // Every peer named gets this rank's connection first, a recv's too: it is how
  // this rank learns that the peer died.
  std::vector<std::pair<int, std::exception_ptr>> unreachable;
  auto failedTo = [&](int peer) -> std::exception_ptr {
    for (const auto& [p, e] : unreachable)
      if (p == peer) return e;
    return nullptr;
  };
  for (const auto& op : ops) {
    if (op.peer < 0 || op.peer >= n || op.peer == rank_ || failedTo(op.peer)) continue;
    try {
      connectTo(op.peer);
    } catch (...) {
      unreachable.emplace_back(op.peer, std::current_exception());
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& op : ops) {
    if (op.peer < 0 || op.peer >= n || op.peer == rank_) {
      op.done(std::make_exception_ptr(InvalidArgument(
          "point-to-point: " + who(rank_) + " cannot " + (op.send ? "send to " : "receive from ") + who(op.peer) +
          (op.peer == rank_ ? " (itself)" : " (the job has " + std::to_string(n) + " ranks)"))));
    } else if (auto err = failedTo(op.peer)) {
      op.done(err);
    } else {
      postLocked(std::move(op));
    }
  }
}

void SocketP2p::postLocked(P2pRequest req) {
  if (stopped_) {
    req.done(std::make_exception_ptr(ShutdownError("chorus is shut down: " + describe(req, rank_))));
    return;
  }
  Peer& p = peers_[req.peer];
  if (!p.failed.empty()) {
    req.done(std::make_exception_ptr(PeerFailure(p.failed + " (" + describe(req, rank_) + ")")));
    return;
  }
  const auto now = Clock::now();
  const auto deadline = now + opts_.timeout;
  const int peer = req.peer;
  pending_.fetch_add(1);
  lastActive_ = now.time_since_epoch().count();
  if (bgIdle_.load()) {
    std::lock_guard<std::mutex> wake(bgMu_);
    bgCv_.notify_all();
  }
  if (req.send) {
    const uint64_t id = nextId_++;
    SendOp& op = p.sends.emplace(id, SendOp{std::move(req), deadline}).first->second;
    Frame f{Kind::kEager, op.req.processSet, op.req.tag, static_cast<uint32_t>(op.req.dtype), id, op.req.bytes, 0};
    if (op.req.bytes <= kEagerMax) {
      p.out->queue(f, op.req.data, op.req.bytes, true);
    } else {
      f.kind = Kind::kRts;
      if (p.sameHost && p.cma && opts_.crossMemoryAttach) f.addr = reinterpret_cast<uint64_t>(op.req.data);
      op.announced = true;
      p.out->queue(f);
    }
    std::string why;
    if (!p.out->flush(&why)) failPeer(peer, "its connection from " + who(rank_) + " failed (" + why + ")");
    if (p.out->wantsWrite()) kick();  // a sleeping poll must watch for room to write
    return;
  }
  p.recvs.push_back(RecvOp{std::move(req), deadline});
  auto op = std::prev(p.recvs.end());
  for (auto a = p.early.begin(); a != p.early.end(); ++a) {
    if (a->f.set != op->req.processSet || a->f.tag != op->req.tag) continue;
    Arrival arrival = std::move(*a);
    p.early.erase(a);
    match(peer, op, arrival.f, &arrival.payload);
    break;
  }
  if (p.in && p.in->wantsWrite()) {
    std::string why;
    if (!p.in->flush(&why)) failPeer(peer, "its connection to " + who(rank_) + " failed (" + why + ")");
    kick();
  }
}

SocketP2p::RecvIt SocketP2p::findRecv(Peer& p, const Frame& f) {
  for (auto it = p.recvs.begin(); it != p.recvs.end(); ++it)
    if (it->streaming == 0 && it->req.processSet == f.set && it->req.tag == f.tag) return it;
  return p.recvs.end();
}

std::string SocketP2p::mismatch(int sender, const Frame& f, const RecvOp& op) const {
  std::ostringstream s;
  s << "point-to-point mismatch: " << who(sender) << " sends " << f.bytes << " bytes ("
    << dtypeName(static_cast<DataType>(f.dtype)) << ") with tag " << f.tag << " in process set " << f.set << " to "
    << who(rank_) << ", which receives " << op.req.bytes << " bytes (" << dtypeName(op.req.dtype)
    << ") with that tag from it";
  return s.str();
}

void SocketP2p::queueOn(Link* link, Kind kind, uint64_t id, const std::string& text) {
  if (!link || !link->open()) return;
  link->queueCopy(Frame{kind, 0, rank_, 0, id, text.size(), 0}, text);
}

void SocketP2p::match(int peer, RecvIt op, const Frame& f, const std::vector<char>* payload) {
  Peer& p = peers_[peer];
  if (f.bytes != op->req.bytes || static_cast<DataType>(f.dtype) != op->req.dtype) {
    const std::string text = mismatch(peer, f, *op);
    queueOn(p.in, Kind::kNack, f.id, text);
    finishRecv(p, op, std::make_exception_ptr(Mismatch(text)));
    return;
  }
  if (f.kind == Kind::kEager) {
    if (f.bytes) std::memcpy(op->req.data, payload->data(), f.bytes);
    queueOn(p.in, Kind::kDone, f.id);
    finishRecv(p, op, nullptr);
    return;
  }
  if (f.addr && p.sameHost && p.cma && p.pid > 0) {
    const int err = readPeerMemory(p.pid, f.addr, op->req.data, f.bytes);
    if (err == 0) {
      queueOn(p.in, Kind::kDone, f.id);
      finishRecv(p, op, nullptr);
      return;
    }
    p.cma = false;  // refused (ptrace rules, another PID namespace): stream from now on
  }
  op->streaming = f.id;
  if (bulk_ && !p.sameHost) {
    op->bulk = bulk_->startRecv(op->req.data, f.bytes, peer, f.id);
    ++bulkInFlight_;
    p.in->queue(Frame{Kind::kCts, 0, rank_, 0, f.id, 0, kViaBulk});
    return;
  }
  queueOn(p.in, Kind::kCts, f.id);
}

void SocketP2p::finishRecv(Peer& p, RecvIt op, std::exception_ptr err) {
  if (p.readingSet && p.reading == op) p.readingSet = false;
  auto done = std::move(op->req.done);
  p.recvs.erase(op);
  pending_.fetch_sub(1);
  done(err);
}

void SocketP2p::finishSend(Peer& p, uint64_t id, std::exception_ptr err) {
  auto it = p.sends.find(id);
  if (it == p.sends.end()) return;
  auto done = std::move(it->second.req.done);
  p.sends.erase(it);
  pending_.fetch_sub(1);
  done(err);
}

char* SocketP2p::onHeader(Link& link, const Frame& f) {
  if (link.peer() < 0) {  // the first frame must be a hello (which has no payload)
    link.close();
    return nullptr;
  }
  Peer& p = peers_[link.peer()];
  if (!link.outgoing()) {
    p.readingSet = false;
    RecvIt op = p.recvs.end();
    if (f.kind == Kind::kEager) {
      op = findRecv(p, f);
      if (op != p.recvs.end() && (op->req.bytes != f.bytes || op->req.dtype != static_cast<DataType>(f.dtype)))
        op = p.recvs.end();  // read aside; onFrame reports the mismatch
      if (op != p.recvs.end()) op->streaming = f.id;
    } else if (f.kind == Kind::kData) {
      for (auto it = p.recvs.begin(); it != p.recvs.end(); ++it)
        if (it->streaming == f.id) op = it;
      if (op == p.recvs.end()) return nullptr;  // its recv gave up: thrown away
    }
    if (op != p.recvs.end()) {
      p.reading = op;
      p.readingSet = true;
      return static_cast<char*>(op->req.data);
    }
  }
  Arrival& a = link.outgoing() ? p.arrivingOut : p.arrivingIn;
  a.f = f;
  a.payload.resize(f.bytes);
  return a.payload.data();
}

void SocketP2p::onFrame(Link& link, const Frame& f) {
  if (link.peer() < 0) {
    const int from = f.tag;
    if (f.kind != Kind::kHello || f.addr != token_ || from < 0 || from >= static_cast<int>(peers_.size()) ||
        from == rank_ || peers_[from].in) {
      link.close();  // not one of this job's ranks, or a second connection
      return;
    }
    if (f.set == 1) {  // the peer made rings for this pair
      std::unique_ptr<RingPair> rings(RingPair::attach(ringName(from, rank_)));
      if (!rings) {
        link.close();  // the peer sees it closed: a peer failure there, not a silent wait
        return;
      }
      link.useRings(std::move(rings), false);
    }
    link.setPeer(from);
    peers_[from].in = &link;
    peers_[from].pid = static_cast<pid_t>(f.id);
    return;
  }
  const int peer = link.peer();
  Peer& p = peers_[peer];
  if (link.outgoing()) {  // the receiver's answers to this rank's sends
    switch (f.kind) {
      case Kind::kDone:
        finishSend(p, f.id, nullptr);
        break;
      case Kind::kNack:
        finishSend(p, f.id, std::make_exception_ptr(
                                Mismatch(std::string(p.arrivingOut.payload.begin(), p.arrivingOut.payload.end()))));
        break;
      case Kind::kCts: {
        auto it = p.sends.find(f.id);
        if (it == p.sends.end()) {  // given up here meanwhile: tell the recv
          queueOn(p.out, Kind::kNack, f.id, who(rank_) + " gave up the send before " + who(peer) + " took it");
          break;
        }
        const P2pRequest& r = it->second.req;
        if (f.addr == kViaBulk && bulk_) {
          it->second.bulk = bulk_->startSend(r.data, r.bytes, peer, f.id);
          ++bulkInFlight_;
          break;
        }
        p.out->queue(Frame{Kind::kData, r.processSet, r.tag, static_cast<uint32_t>(r.dtype), f.id, r.bytes, 0}, r.data,
                     r.bytes);
        break;
      }
      default:
        failPeer(peer, "it sent a frame of an unknown kind");
    }
    return;
  }
  switch (f.kind) {  // the peer's sends to this rank
    case Kind::kEager:
      if (p.readingSet) {
        RecvIt op = p.reading;
        queueOn(p.in, Kind::kDone, f.id);
        finishRecv(p, op, nullptr);
        break;
      }
      if (RecvIt op = findRecv(p, f); op != p.recvs.end()) {
        match(peer, op, f, &p.arrivingIn.payload);
      } else {
        p.early.push_back(Arrival{f, std::move(p.arrivingIn.payload)});
        p.arrivingIn.payload = {};
      }
      break;
    case Kind::kRts:
      if (RecvIt op = findRecv(p, f); op != p.recvs.end()) {
        match(peer, op, f, nullptr);
      } else {
        p.early.push_back(Arrival{f, {}});
      }
      break;
    case Kind::kData:
      if (p.readingSet) {
        queueOn(p.in, Kind::kDone, f.id);
        finishRecv(p, p.reading, nullptr);
      }
      break;
    case Kind::kNack: {  // the sender gave up a send this rank had matched or kept
      const std::string text(p.arrivingIn.payload.begin(), p.arrivingIn.payload.end());
      for (auto it = p.recvs.begin(); it != p.recvs.end(); ++it) {
        if (it->streaming != f.id) continue;
        finishRecv(p, it, std::make_exception_ptr(Timeout(text)));
        break;
      }
      for (auto a = p.early.begin(); a != p.early.end(); ++a) {
        if (a->f.id != f.id) continue;
        p.early.erase(a);
        break;
      }
      break;
    }
    default:
      failPeer(peer, "it sent a frame of an unknown kind");
  }
  p.readingSet = false;
}

void SocketP2p::failPeer(int peer, const std::string& why) {
  Peer& p = peers_[peer];
  if (!p.failed.empty()) return;
  p.failed = "peer failure: " + who(peer) + " is unreachable: " + why;
  if (p.out) p.out->close();
  if (p.in) p.in->close();
  auto sends = std::move(p.sends);
  auto recvs = std::move(p.recvs);
  p.sends.clear();
  p.recvs.clear();
  p.early.clear();
  p.readingSet = false;
  pending_.fetch_sub(static_cast<int>(sends.size() + recvs.size()));
  // (An MPI transfer in flight cannot be recalled; an MPI job whose peer died ends anyway.)
  for (const auto& [id, op] : sends) bulkInFlight_ -= op.bulk ? 1 : 0;
  for (const auto& op : recvs) bulkInFlight_ -= op.bulk ? 1 : 0;
  for (auto& [id, op] : sends) op.req.done(std::make_exception_ptr(PeerFailure(p.failed + " (" + describe(op.req, rank_) + ")")));
  for (auto& op : recvs) op.req.done(std::make_exception_ptr(PeerFailure(p.failed + " (" + describe(op.req, rank_) + ")")));
}

void SocketP2p::checkDeadlines() {
  const auto now = Clock::now();
  if (now < nextDeadlineCheck_) return;
  nextDeadlineCheck_ = now + std::chrono::milliseconds(10);
  const std::string after = " timed out after " + std::to_string(opts_.timeout.count()) + " ms";
  for (size_t r = 0; r < peers_.size(); ++r) {
    Peer& p = peers_[r];
    const int peer = static_cast<int>(r);
    for (auto it = p.sends.begin(); it != p.sends.end();) {
      auto cur = it++;
      if (cur->second.deadline > now || cur->second.bulk) continue;
      const std::string text = describe(cur->second.req, rank_) + after + ": no matching recv took it";
      if (p.out && p.out->midPayload(Kind::kData, cur->first)) {  // the stream cannot stop halfway
        failPeer(peer, text);
        break;
      }
      if (cur->second.announced) queueOn(p.out, Kind::kNack, cur->first, text);  // its recv must not read it now
      finishSend(p, cur->first, std::make_exception_ptr(Timeout(text)));
    }
    for (auto it = p.recvs.begin(); it != p.recvs.end();) {
      auto cur = it++;
      if (cur->deadline > now || cur->bulk) continue;
      std::string text = describe(cur->req, rank_) + after;
      std::string others;
      for (const auto& a : p.early)
        others += (others.empty() ? "" : ", ") + std::to_string(a.f.tag) + " (set " + std::to_string(a.f.set) + ")";
      text += others.empty() ? ": nothing came" : "; " + who(peer) + " sent with tag(s) " + others + " instead";
      if ((p.readingSet && p.reading == cur) || (cur->streaming && p.in && p.in->midPayload(Kind::kData, cur->streaming))) {
        failPeer(peer, text);
        break;
      }
      finishRecv(p, cur, std::make_exception_ptr(Timeout(text)));
    }
  }
}

void SocketP2p::checkBulk() {
  if (bulkInFlight_ == 0) return;
  for (size_t r = 0; r < peers_.size(); ++r) {
    Peer& p = peers_[r];
    auto finished = [&](uint64_t request) {
      try {
        if (!bulk_->done(request)) return false;
      } catch (const Error& e) {
        failPeer(static_cast<int>(r), e.what());
        return false;
      }
      --bulkInFlight_;
      return true;
    };
    for (auto it = p.sends.begin(); it != p.sends.end();) {
      auto cur = it++;
      if (cur->second.bulk && finished(cur->second.bulk)) finishSend(p, cur->first, nullptr);
      if (!p.failed.empty()) break;
    }
    for (auto it = p.recvs.begin(); it != p.recvs.end();) {
      auto cur = it++;
      if (cur->bulk && finished(cur->bulk)) finishRecv(p, cur, nullptr);
      if (!p.failed.empty()) break;
    }
  }
}

void SocketP2p::acceptAll(int listener) {
  while (true) {
    const int fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) return;
    setNonBlocking(fd);
    links_.push_back(std::make_unique<Link>(fd, -1, false));
  }
}

void SocketP2p::progressOnce(int timeoutMs, bool background) {
  thread_local std::vector<pollfd> fds;
  thread_local std::vector<Link*> links;
  thread_local std::vector<Link*> slept;
  thread_local unsigned spins = 0;
  slept.clear();
  // Spinning: frames between ranks of a host come through rings, so most passes
  // look at the rings alone; every 16th also polls the sockets (other hosts,
  // doorbells, closed connections, new connections).
  if (timeoutMs == 0 && ++spins % 16 != 0) {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return;
    bool rings = false;
    for (auto& l : links_) {
      if (!l->open() || !l->hasRings()) continue;
      rings = true;
      std::string why;
      if (!(l->pump(*this, &why) && l->flush(&why)) && l->peer() >= 0)
        failPeer(l->peer(), "its connection " + std::string(l->outgoing() ? "from " : "to ") + who(rank_) +
                                " closed (" + why + ")");
    }
    if (rings) {
      flushAll();
      checkBulk();
      checkDeadlines();
      return;
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return;
    fds.clear();
    links.clear();
    fds.push_back({wakeFd_, POLLIN, 0});
    fds.push_back({listenFd_, POLLIN, 0});
    fds.push_back({localFd_, POLLIN, 0});  // (-1: ignored by poll)
    for (auto& l : links_) {
      if (!l->open()) continue;
      fds.push_back({l->fd(), static_cast<short>(POLLIN | (l->wantsWrite() ? POLLOUT : 0)), 0});
      links.push_back(l.get());
    }
    // A caller that came to drive after the background thread looked must not
    // find it polling beside it for long.
    if (background && waiters_.load() > 0) timeoutMs = 0;
    // A bulk transfer moves only while someone asks after it.
    if (bulkInFlight_ > 0) timeoutMs = std::min(timeoutMs, 1);
    // Rings have no descriptor: their writers ring the doorbell while we sleep.
    if (timeoutMs > 0) {
      for (Link* l : links) {
        if (!l->hasRings()) continue;
        slept.push_back(l);
        if (l->sleepOnRing()) timeoutMs = 0;
      }
    }
    // Under mu_: a post after this sees the sleeper and kicks the poll.
    if (timeoutMs > 0) sleepers_.fetch_add(1);
  }
  int rc;
  do rc = ::poll(fds.data(), fds.size(), timeoutMs); while (rc < 0 && errno == EINTR);
  if (timeoutMs > 0) sleepers_.fetch_sub(1);
  std::lock_guard<std::mutex> lock(mu_);
  for (Link* l : slept) l->wakeFromRing();
  if (stopped_) return;
  if (rc >= 0) {
    if (fds[0].revents) {
      uint64_t n;
      (void)!::read(wakeFd_, &n, sizeof(n));
    }
    if (fds[1].revents) acceptAll(listenFd_);
    if (fds[2].revents) acceptAll(localFd_);
    for (size_t i = 0; i < links.size(); ++i) {
      Link* l = links[i];
      const short ev = fds[i + 3].revents;
      if ((!ev && !l->hasRings()) || !l->open() || l->fd() != fds[i + 3].fd) continue;
      std::string why;
      const bool ok = l->pump(*this, &why) && l->flush(&why);
      if (!ok) {
        if (l->peer() >= 0) {
          failPeer(l->peer(), "its connection " + std::string(l->outgoing() ? "from " : "to ") + who(rank_) +
                                  " closed (" + why + ")");
        } else {
          l->close();
        }
      }
    }
  }
  flushAll();
  checkBulk();
  checkDeadlines();
}

void SocketP2p::flushAll() {
  for (auto& l : links_) {
    if (!l->open() || !l->wantsWrite()) continue;
    std::string why;
    if (!l->flush(&why) && l->peer() >= 0) failPeer(l->peer(), "its connection failed (" + why + ")");
  }
}

bool SocketP2p::drive(const std::function<bool()>& done) {
  if (stopping_) return false;
  waiters_.fetch_add(1);
  const auto start = Clock::now();
  constexpr auto kSlice = std::chrono::milliseconds(50);  // then the caller checks for signals
  while (!done() && !stopping_) {
    const auto since = Clock::now() - start;
    if (since >= kSlice) break;
    progressOnce(since < spin_ ? 0 : 5);
  }
  lastActive_ = Clock::now().time_since_epoch().count();
  waiters_.fetch_sub(1);
  return !stopping_;
}

void SocketP2p::background() {
  using namespace std::chrono_literals;
  std::unique_lock<std::mutex> lock(bgMu_);
  while (!stopping_) {
    const auto quiet = Clock::now() - Clock::time_point(Clock::duration(lastActive_.load()));
    if (pending_.load() == 0 && quiet > 100ms) {  // long idle: sleep until a post
      bgIdle_ = true;
      bgCv_.wait(lock, [&] { return stopping_ || pending_.load() > 0; });
      bgIdle_ = false;
      continue;
    }
    bgCv_.wait_for(lock, 2ms, [&] { return stopping_.load(); });
    if (stopping_ || pending_.load() == 0 || waiters_.load() > 0 || quiet < 1ms) continue;
    lock.unlock();
    progressOnce(20, true);
    lock.lock();
  }
}

}  // namespace chorus::p2p

namespace chorus {

std::unique_ptr<PointToPoint> makePointToPoint(Store& store, const std::string& prefix, int rank,
                                               const std::vector<std::string>& hosts, const P2pOptions& opts,
                                               std::unique_ptr<P2pBulk> bulk) {
  return std::make_unique<p2p::SocketP2p>(store, prefix, rank, hosts, opts, std::move(bulk));
}

}  // namespace chorus
