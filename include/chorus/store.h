#pragma once
// Key-value store used for rendezvous. Blocking reads take a timeout and throw
// chorus::Timeout when it passes.
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace chorus {

class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::vector<char>& value) = 0;
  // Blocks until the key exists.
  virtual std::vector<char> get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  // Atomically adds delta to an integer counter (missing = 0), returns the new value.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  virtual bool check(const std::string& key) = 0;
};

// In-process store shared by ranks that run as threads of one process.
std::shared_ptr<Store> makeMemoryStore();

// Client of the TCP store that chorusrun serves; every request carries the job secret.
std::shared_ptr<Store> connectTcpStore(const std::string& host, int port, const std::string& secret,
                                       std::chrono::milliseconds connectTimeout);

// The TCP store server. Runs on its own thread until destroyed.
class TcpStoreServer {
 public:
  virtual ~TcpStoreServer() = default;
  virtual int port() const = 0;
  // Connections refused: no or a wrong secret, no handshake in time, oversized or malformed frames.
  virtual int64_t refusedCount() const = 0;
  // Authenticated connections open now.
  virtual int connectionCount() const = 0;
};
// A connection must send the job secret first, in a handshake of at most 4 KiB
// within handshakeSeconds; until then it holds no thread and at most that
// buffer, and at most maxPending such connections are kept (the oldest goes).
struct StoreServerOptions {
  double handshakeSeconds = 10;
  int maxPending = 64;
  double summarySeconds = 10;  // refusals after an address's first: one line per address this often
};
// port 0 picks a free port. bindHost "0.0.0.0" listens on every interface.
std::unique_ptr<TcpStoreServer> startTcpStoreServer(const std::string& bindHost, int port,
                                                    const std::string& secret,
                                                    const StoreServerOptions& options = {});
// For a store whose port every rank derives alike (torchrun's MASTER_PORT+1,
// Slurm's job numbers) and that someone else may have taken: the server
// listens on the first of `ports` that no socket has (one in use, even only
// bound, means the next; one left only in TIME_WAIT is taken); throws naming
// them when all are. A client tries the
// same ports in the same order and keeps the first whose server admits the job
// secret (another job's store, which refuses the secret, and a silent program are passed
// over; a program that answers "admitted" is trusted: the handshake proves the secret one way).
std::unique_ptr<TcpStoreServer> startTcpStoreServerOnFirstFree(const std::string& bindHost,
                                                               const std::vector<int>& ports,
                                                               const std::string& secret,
                                                               const StoreServerOptions& options = {});
std::shared_ptr<Store> connectTcpStoreOnFirstOf(const std::string& host, const std::vector<int>& ports,
                                                const std::string& secret, std::chrono::milliseconds timeout);
// A random hex secret for a new job.
std::string generateSecret();

}  // namespace chorus
