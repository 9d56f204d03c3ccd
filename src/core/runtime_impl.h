#pragma once
#include <deque>
#include <list>
#include <map>
#include <memory>
#include <mutex>

#include "chorus/runtime.h"
#include "chorus/store.h"
#include "comm/communicator.h"
#include "comm/bootstrap.h"
#include "comm/point_to_point.h"
#include "core/cycle_driver.h"
#include "core/entry.h"
#include "core/name_registry.h"
#include "core/process_set_table.h"
#include "core/op_log.h"
#include "core/timeline.h"
#include "base/net_address.h"

namespace chorus {

struct LaunchEnv;
class MetricsServer;

// Config::store, or a connection to the TCP store the config names.
std::shared_ptr<Store> openStore(const Config& cfg);

class RuntimeImpl {
 public:
  void init(Config config);
  void shutdown();
  void requireInit() const;

  ProcessSet addProcessSet(const std::vector<int>& ranks);
  void removeProcessSet(int32_t id);

  // Registers the Work for synchronize() and hands the entries to the set's controller.
  Work submit(int32_t setId, std::vector<Entry> entries, std::shared_ptr<WorkState> work);
  Work submit(std::shared_ptr<Controller> controller, std::vector<Entry> entries, std::shared_ptr<WorkState> work);
  std::string autoName(int32_t setId, const char* kind);
  std::string resolveName(const OpOptions& opts, const char* kind);
  void synchronize();
  // CUDA tensors travel through pinned host memory: a send is copied down on
  // the caller's stream first; a receive is copied up on a side stream.
  std::vector<Work> postP2p(const std::vector<P2pOp>& ops, int32_t setId, void* stream = nullptr);
  // The elastic driver's count of host-set changes, and whether they only removed hosts.
  std::pair<int64_t, bool> elasticHostUpdates();
  std::pair<int, int> elasticJoinNextRound();

  Config config;
  bool initialized = false;
  int rank = -1, size = 0, localRank = 0, localSize = 1, crossRank = 0, crossSize = 1;
  bool homogeneous = true;
  std::shared_ptr<Store> store;
  std::string prefix;  // store key prefix of this init generation
  std::shared_ptr<TransportDevice> device;
  std::vector<std::string> hosts;  // host name of every global rank
  ProcessSetTable sets;
  // Written on rank 0 only; shared by this rank's controllers.
  std::shared_ptr<Timeline> timeline = std::make_shared<Timeline>();
  std::shared_ptr<OpLog> opLog = std::make_shared<OpLog>();  // shared by this rank's controllers
  const Bootstrap* mpiWorld() const { return mpi_.get(); }
  // Point-to-point, for the whole job; waiters drive it through p2pDriver.
  std::unique_ptr<PointToPoint> p2p;
  std::shared_ptr<CycleDriver> p2pDriver;
  // The device backend for CUDA tensors: config.device, else CUDA (opened on
  // first use; throws chorus::Error saying what is missing).
  std::shared_ptr<DeviceBackend> deviceBackend();
  std::map<int, std::shared_ptr<DeviceStream>> p2pStreams;  // receives' copies up, per device (made on first use)
  // Pinned buffers of receives whose copy up may still be queued, each with the
  // event after it: kept until it has passed (a Work may be gone before that).
  struct InFlightCopy {
    std::shared_ptr<DeviceEvent> done;
    std::shared_ptr<void> pinned;
  };
  std::mutex copiesMu;
  std::deque<InFlightCopy> copiesUp;
  void releaseCopiesUp(bool wait);  // drops those done (wait: all, after waiting)

 private:
  void exchangeHosts();
  void computeTopology();
  void checkStaticSetsAgree(Communicator& global);
  void bootstrapFromMpi(Config& cfg);
  void chooseTorchMaster();
  void startMetrics();
  std::unique_ptr<MetricsServer> metrics_;
  void serveRendezvous(const Config& cfg);
  void bootstrapFromEnv(Config& cfg, const LaunchEnv& env);
  // Elastic workers: waits for the driver's next round that includes this worker
  // and takes its rank and size from it (src/core/elastic.cc).
  void elasticRendezvous(Config& cfg);
  void elasticJoin(Config& cfg);  // connects the store, then elasticRendezvous
  // The negotiation communicator of a set when CHORUS_CONTROLLER asks for one
  // apart from the data path (every rank calls it: an MPI split is collective).
  std::unique_ptr<Communicator> makeControl(const ProcessSet& ps);
  // The data communicator of a set (null on non-members; every rank calls it).
  std::unique_ptr<Communicator> makeDataComm(const ProcessSet& ps);
  std::shared_ptr<Controller> makeController(const ProcessSet& ps);
  // Every rank states `what`; throws on every rank if any two differ.
  void agree(const std::string& op, const std::string& what);
  CommOptions commOptions() const;
  static CommOptions commOptionsOf(const Config& config);
  void discardTimeline();  // stops it, dropping any error (init failed)
  void startP2p();
  void stopP2p();
  // Registers an op for synchronize().
  void track(const std::shared_ptr<WorkState>& work);

  // Set when the job runs under mpirun: MPI bootstraps the store (rank 0 serves it).
  std::unique_ptr<Bootstrap> mpi_;  // the MPI job chorus joined (mpirun, init(comm=...))
  std::unique_ptr<TcpStoreServer> storeServer_;
 public:
  std::pair<std::string, int> torchMaster_;  // see Runtime::torchMaster
  std::vector<int> storePorts_;              // a derived store port's candidates, until connected
  net::HeldPort torchPortHeld_;              // rank 0: the port it chose for torchMaster_, until shutdown
 private:
  std::mutex mu_;
  std::map<std::string, int64_t> counters_;
  std::shared_ptr<NameRegistry> names_ = std::make_shared<NameRegistry>();  // shared by this rank's controllers
  std::list<std::weak_ptr<WorkState>> outstanding_;
  int64_t dynamicSeq_ = 0;
  int64_t elasticRound_ = 0;  // the last elastic round joined; kept across re-inits
  std::pair<int, int> elasticPending_{-1, 0};  // rank, size of a round joined before init
  int64_t elasticBaseUpdates_ = 0;             // host-set changes the joined round includes
  int32_t nextSetId_ = 1;
};

}  // namespace chorus
