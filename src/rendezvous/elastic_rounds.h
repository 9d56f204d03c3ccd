#pragma once
// The elastic driver (horovodrun --min-np/--max-np), apart from how its workers
// start: it serves the job's store, starts a worker per free slot of the hosts
// discovery offers, groups the live workers into rounds (elastic_keys.h),
// blacklists the host of a worker that fails, and tells the workers when the host
// set changed. The job ends when every worker has exited 0, or fails when fewer
// than minNp workers remain for longer than elasticTimeout, or after more than
// resetLimit resets. chorusrun runs workers as processes (launcher/elastic_driver),
// chorus.ray as Ray actors: both drive this one implementation.
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "chorus/store.h"

namespace chorus::elastic {

struct Options {
  int minNp = 1;
  int maxNp = 0;            // 0: as many as the slots
  int initialNp = 0;        // workers the job starts with (0: as many as allowed)
  int resetLimit = -1;      // -1: no limit
  double cooldownMin = 0;   // a failed host comes back after a random time in
  double cooldownMax = 0;   // [min, max] x 2^(failures-1); 0 0: never
  double elasticTimeout = 600;
  // A host is blacklisted when unreachable, when all its workers die together, or
  // after this many of its workers have failed.
  int blacklistAfter = 3;
  double discoveryInterval = 1.0;
  std::string name = "chorusrun";  // what its messages start with
  // How the messages name the settings (chorusrun's flags; chorus.ray's arguments).
  std::string minNpWord = "--min-np", resetLimitWord = "--reset-limit", timeoutWord = "--elastic-timeout",
              blacklistWord = "--blacklist-after-failures";
};

struct Host {
  std::string name;
  int slots = 1;
};

struct WorkerEnd {
  int handle = -1;
  bool ok = false;           // exited 0
  std::string what;          // "exited with code 3", "was killed by signal 9 ..."
  bool unreachable = false;  // its host could not be reached (ssh's 255)
};

// How workers start and stop: chorusrun's processes, or chorus.ray's actors.
class WorkerPool {
 public:
  virtual ~WorkerPool() = default;
  virtual std::vector<Host> discover() = 0;  // throws with the reason
  // Starts worker `id` on host; env holds the elastic variables. Returns its handle.
  virtual int start(const std::string& id, const std::string& host, int slot,
                    const std::map<std::string, std::string>& env) = 0;
  virtual void stop(int handle) = 0;  // asks it to end
  virtual void stopAll() = 0;         // ends every worker now (the job failed)
  virtual void log(const std::string& line);  // one line of the driver's news (stderr)
};

class Driver {
 public:
  // Serves the store on bindAddr:port (0: any) for workers that reach it at advertisedAddr.
  Driver(Options o, WorkerPool& pool, const std::string& bindAddr, const std::string& advertisedAddr, int port);
  ~Driver();

  const std::string& storeAddr() const { return addr_; }
  int storePort() const { return server_->port(); }
  const std::string& secret() const { return secret_; }
  // The variables every worker needs besides the elastic ones: the store and its secret.
  std::map<std::string, std::string> storeEnvironment() const;

  void begin();  // first discovery, first workers
  // One turn: the workers that ended, discovery when due, the next round when every
  // member waits. Returns the job's exit code once it is over (0: every worker finished).
  std::optional<int> step(const std::vector<WorkerEnd>& ended);
  // Stops the job (a signal): every worker ends.
  int abort(const std::string& why);
  const std::vector<std::string>& hosts() const { return hostOrder_; }  // in the order they appeared
  const std::string& failure() const { return failure_; }

 private:
  struct Worker;
  struct HostState;
  std::vector<Host> usableHosts(const std::vector<Host>& found);
  void startWorker(const std::string& host, int slot);
  void updateHosts(bool first);
  void handleEnded(const WorkerEnd& e);
  void removeHost(const std::string& host, const std::string& why);
  int hostWorkers(const std::string& host) const;
  void bumpUpdated(bool removedOnly);
  std::vector<Worker*> members();
  bool allWaiting(const std::vector<Worker*>& m);
  void publish(const std::vector<Worker*>& m);
  int fail(const std::string& why);
  void setKey(const std::string& key, const std::string& value);

  Options o_;
  WorkerPool& pool_;
  std::string addr_, secret_;
  std::unique_ptr<TcpStoreServer> server_;
  std::shared_ptr<Store> client_;
  std::vector<Worker> workers_;
  std::vector<std::string> hostOrder_;
  std::map<std::string, HostState> hostState_;
  int64_t round_ = 0, updates_ = 0;
  int resets_ = 0;
  std::chrono::steady_clock::time_point lastDiscovery_, shortSince_;
  std::string failure_;
  std::mt19937 rng_{std::random_device{}()};
};


}  // namespace chorus::elastic
