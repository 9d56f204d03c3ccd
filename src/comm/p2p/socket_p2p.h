#pragma once
// Point-to-point over connections made on first use (Unix sockets within a
// host, TCP between hosts), one each way per pair
// (a rank sends on the connection it made, and answers on the one it accepted,
// so two ranks that start talking at once never race to connect). Small
// messages travel with their header (eager); large ones are announced and move
// once the receiver has matched them: read by the receiver straight from the
// sender's memory on the same host (cross-memory attach, one copy), streamed
// over the connection otherwise. Progress: a thread that waits drives it
// (spinning briefly, then sleeping in poll); a background thread does when no
// thread waits.
#include <poll.h>
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "comm/p2p/p2p_link.h"
#include "comm/point_to_point.h"

namespace chorus::p2p {

class SocketP2p : public PointToPoint, private Link::Sink {
 public:
  SocketP2p(Store& store, const std::string& prefix, int rank, const std::vector<std::string>& hosts,
            const P2pOptions& opts, std::unique_ptr<P2pBulk> bulk);
  ~SocketP2p() override;

  void post(std::vector<P2pRequest> ops) override;
  bool drive(const std::function<bool()>& done) override;
  void shutdown() override;

 private:
  using Clock = std::chrono::steady_clock;
  struct SendOp {
    P2pRequest req;
    Clock::time_point deadline;
    bool announced = false;  // kRts: waiting for kCts or kDone
    uint64_t bulk = 0;       // the payload is moving by bulk_ (no timeout then: it cannot stop halfway)
  };
  struct RecvOp {
    P2pRequest req;
    Clock::time_point deadline;
    uint64_t streaming = 0;  // the sender's id once kCts went out (0: not matched)
    uint64_t bulk = 0;       // as SendOp::bulk
  };
  using RecvIt = std::list<RecvOp>::iterator;
  struct Arrival {  // a send that came before its recv
    Frame f;
    std::vector<char> payload;  // kEager
  };
  struct Peer {
    Link* out = nullptr;  // made by this rank: its sends, their answers
    Link* in = nullptr;   // made by the peer: its sends, this rank's answers
    pid_t pid = 0;        // from the peer's hello
    bool sameHost = false;
    bool cma = true;      // cross-memory attach still believed to work
    std::string failed;   // why the pair is unusable, once it is
    std::map<uint64_t, SendOp> sends;  // by id
    std::list<RecvOp> recvs;           // in posting order
    std::deque<Arrival> early;         // in arrival order
    RecvIt reading{};                  // the recv a kEager/kData payload is read into...
    bool readingSet = false;           // ...when set
    // A payload read with no recv for it (kEager, kNack's text), one per link:
    // the two links' frames interleave.
    Arrival arrivingIn, arrivingOut;
  };

  // Link::Sink, on the in (or out) link of a peer; mu_ held.
  char* onHeader(Link& link, const Frame& f) override;
  void onFrame(Link& link, const Frame& f) override;

  void connectTo(int peer);  // without mu_; throws PeerFailure
  std::string ringName(int from, int to) const;
  void postLocked(P2pRequest req);
  void startSend(int peer, SendOp& op);
  // A recv meets a send that arrived: kEager (with its payload) or kRts.
  void match(int peer, RecvIt op, const Frame& f, const std::vector<char>* payload);
  // The first posted recv not yet matched that f would match, or end().
  RecvIt findRecv(Peer& p, const Frame& f);
  void finishRecv(Peer& p, RecvIt op, std::exception_ptr err);
  void finishSend(Peer& p, uint64_t id, std::exception_ptr err);
  void queueOn(Link* link, Kind kind, uint64_t id, const std::string& text = "");
  std::string mismatch(int sender, const Frame& f, const RecvOp& op) const;
  void failPeer(int peer, const std::string& why);
  void checkDeadlines();
  void checkBulk();  // finishes the ops whose bulk transfers are done
  void flushAll();
  // One round: poll every connection (timeoutMs: 0 spins) and handle what is ready.
  // The background thread polls only while no caller drives.
  void progressOnce(int timeoutMs, bool background = false);
  void acceptAll(int listener);
  void kick();
  void background();

  int rank_;
  std::vector<std::string> hosts_;
  P2pOptions opts_;
  Store& store_;
  std::string prefix_;
  uint64_t token_ = 0;
  int listenFd_ = -1;
  int localFd_ = -1;  // a Unix socket for ranks of this host (half the cost of loopback TCP)
  int wakeFd_ = -1;
  std::chrono::microseconds spin_;
  std::unique_ptr<P2pBulk> bulk_;  // large messages to other hosts, when MPI carries the data
  int bulkInFlight_ = 0;           // (mu_) polls do not sleep while some are

  std::mutex mu_;  // everything below
  std::vector<Peer> peers_;
  std::unique_ptr<std::atomic<bool>[]> connected_;  // by peer: this rank's connection exists (or failed)
  std::vector<std::unique_ptr<Link>> links_;  // never shrinks while running (pollers hold indices)
  uint64_t nextId_ = 1;
  Clock::time_point nextDeadlineCheck_{};
  bool stopped_ = false;

  std::mutex connectMu_;           // one connect at a time
  // Threads poll side by side (what they find is handled under mu_): a waiter
  // never waits for the background thread to hand over.
  std::atomic<int> waiters_{0};    // threads in drive()
  std::atomic<int> sleepers_{0};   // polls with a timeout under way
  std::atomic<bool> stopping_{false};
  // The background thread drives ops in flight that no caller has driven for a
  // while (an isend followed by computation); it never polls beside a waiter,
  // and is not woken per op (a thread wake-up costs more than a small message).
  std::atomic<int> pending_{0};         // ops in flight
  std::atomic<int64_t> lastActive_{0};  // steady-clock ns of the last post or drive
  std::atomic<bool> bgIdle_{false};     // asleep until a post wakes it
  std::mutex bgMu_;
  std::condition_variable bgCv_;
  std::thread bg_;
};

}  // namespace chorus::p2p
