// What a careful reading of the GPU code found, checked through the host
// stand-in (which enforces CUDA's per-thread device and stream rules): no
// context on a GPU the rank does not use, the NCCL path's watchdog (its clock,
// its aborts, device errors) over NCCL functions of the test's own, and a CUDA
// receive ordered after the caller's stream. Not GPU tests: tests/gpu runs the
// real thing.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <thread>

#include "chorus/error.h"
#include "comm/device_path.h"
#include "comm/nccl/nccl_api.h"
#include "device_helpers.h"

namespace chorus::testing {
namespace {

using namespace std::chrono_literals;

// NCCL functions for one rank over the stand-in: an allreduce is a copy queued
// on the caller's stream, held while `hold` is set (a peer that never comes)
// until the communicator is aborted.
struct FakeNccl {
  static inline DeviceBackend* dev = nullptr;
  static inline std::atomic<int> aborts{0}, destroys{0}, asyncError{0};
  static inline std::atomic<bool> hold{false}, inCall{false}, abortedInCall{false};
  static inline std::function<void()> duringCall;

  static NcclApi api(DeviceBackend& b) {
    dev = &b;
    aborts = 0;
    destroys = 0;
    asyncError = 0;
    hold = false;
    abortedInCall = false;
    duringCall = nullptr;
    NcclApi a{};
    a.path = "fake";
    a.version = kMinNcclVersion;
    a.getUniqueId = [](NcclUniqueId*) { return 0; };
    a.commInitRank = [](NcclComm* c, int, NcclUniqueId, int) {
      *c = reinterpret_cast<NcclComm>(uintptr_t{1});
      return 0;
    };
    a.commDestroy = [](NcclComm) {
      ++destroys;
      return 0;
    };
    a.commAbort = [](NcclComm) {
      if (inCall) abortedInCall = true;
      ++aborts;
      return 0;
    };
    a.commGetAsyncError = [](NcclComm, int* e) {
      *e = asyncError;
      return 0;
    };
    a.getErrorString = [](int) { return "fake NCCL error"; };
    a.allReduce = [](const void* in, void* out, size_t count, int, int, NcclComm, void* stream) {
      inCall = true;
      if (duringCall) duringCall();
      standInEnqueue(*dev, stream, [=] {
        while (hold && aborts == 0) std::this_thread::sleep_for(1ms);
        std::memmove(standInHostAddress(*dev, out), standInHostAddress(*dev, in), count * 4);
      });
      inCall = false;
      return 0;
    };
    return a;
  }
};

// A one-rank CPU communicator: all the NCCL path asks of it is the id's broadcast.
class SoloComm final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void allreduce(void*, size_t, DataType, ReduceOp) override {}
  void allreduceBitsOr(uint64_t*, size_t) override {}
  void allgatherv(const void* in, void* out, const std::vector<size_t>& bytes) override {
    std::memmove(out, in, bytes[0]);
  }
  void broadcast(void*, size_t, int) override {}
  void alltoallv(const void* in, const std::vector<size_t>& sendBytes, void* out, const std::vector<size_t>&,
                 size_t) override {
    std::memmove(out, in, sendBytes[0]);
  }
  void reducescatter(void*, void*, const std::vector<size_t>&, DataType, ReduceOp) override {}
  void barrier() override {}
};

template <typename F>
bool within(std::chrono::milliseconds limit, F&& done) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

struct NcclFixture {
  std::shared_ptr<DeviceBackend> dev;
  NcclApi api;
  SoloComm cpu;
  std::unique_ptr<DevicePath> path;
  void* buf;
  NcclFixture(double timeout, int devices = 1, int ordinal = 0) {
    HostStandInOptions o;
    o.devices = devices;
    dev = makeHostStandIn(o);
    dev->setCurrent(ordinal);
    api = FakeNccl::api(*dev);
    DevicePathOptions po;
    po.timeoutSeconds = timeout;
    path = makeNcclPathWith(api, dev, ordinal, cpu, po);
    buf = dev->allocDevice(ordinal, 64);
  }
  ~NcclFixture() {
    path.reset();
    try {  // (a test may have broken the device)
      dev->synchronizeStream(nullptr);
      dev->freeDevice(buf);
    } catch (const Error&) {
    }
  }
  void allreduce() { path->allreduce(buf, buf, 16, DataType::kFloat32, ReduceOp::kSum, 1.0, nullptr); }
};

TEST(NcclWatchdog, TheClockStartsWhenTheOpStartsOnTheGpuNotWhenItIsQueued) {
  NcclFixture f(0.4);
  // The caller's kernels keep the stream busy past the timeout; the op itself is quick.
  standInEnqueue(*f.dev, nullptr, [] { std::this_thread::sleep_for(1200ms); });
  f.allreduce();
  f.dev->synchronizeStream(nullptr);
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(FakeNccl::aborts, 0);
  EXPECT_NO_THROW(f.allreduce());
}

TEST(NcclWatchdog, AnOpStuckOnTheGpuIsAbortedAfterTheTimeout) {
  NcclFixture f(0.3);
  FakeNccl::hold = true;
  f.allreduce();
  ASSERT_TRUE(within(5000ms, [] { return FakeNccl::aborts > 0; }));
  try {
    f.allreduce();
    FAIL() << "an op after the abort ran";
  } catch (const Timeout& e) {
    EXPECT_NE(std::string(e.what()).find("did not finish within"), std::string::npos) << e.what();
  }
}

TEST(NcclWatchdog, AnAbortAskedForDuringANcclCallWaitsForTheCallToReturn) {
  NcclFixture f(30);
  int abortsSeenInCall = -1;
  FakeNccl::duringCall = [&] {
    std::thread([&] { f.path->abort(); }).join();  // (another thread: the executor's failure path)
    abortsSeenInCall = FakeNccl::aborts;
  };
  f.allreduce();
  FakeNccl::duringCall = nullptr;
  EXPECT_EQ(abortsSeenInCall, 0);
  EXPECT_FALSE(FakeNccl::abortedInCall);
  EXPECT_EQ(FakeNccl::aborts, 1);  // (done as the call left)
  EXPECT_THROW(f.allreduce(), PeerFailure);
}

// A call blocked inside NCCL (on a dead peer) returns only when the communicator
// is aborted: past a grace period the deferred abort goes ahead.
TEST(NcclWatchdog, ACallThatNeverReturnsIsAbortedAfterAGracePeriod) {
  NcclFixture f(0.4);
  bool returned = false;
  FakeNccl::duringCall = [&] {
    std::thread([&] { f.path->abort(); }).join();
    returned = within(5000ms, [] { return FakeNccl::aborts > 0; });  // (NCCL's blocked call ends at the abort)
  };
  f.allreduce();
  FakeNccl::duringCall = nullptr;
  EXPECT_TRUE(returned) << "the abort waited for a call that could not return";
  EXPECT_EQ(FakeNccl::aborts, 1);
  EXPECT_THROW(f.allreduce(), PeerFailure);
}

TEST(NcclWatchdog, NcclsAsynchronousErrorAbortsTheCommunicator) {
  NcclFixture f(30);
  FakeNccl::asyncError = 6;  // (ncclRemoteError)
  ASSERT_TRUE(within(5000ms, [] { return FakeNccl::aborts > 0; }));
  try {
    f.allreduce();
    FAIL() << "an op after the abort ran";
  } catch (const PeerFailure& e) {
    EXPECT_NE(std::string(e.what()).find("fake NCCL error"), std::string::npos) << e.what();
  }
}

TEST(NcclWatchdog, ADeviceErrorWhilePollingAbortsInsteadOfEndingTheProcess) {
  NcclFixture f(30);
  FakeNccl::hold = true;
  f.allreduce();
  standInBreak(*f.dev, "CUDA error: an illegal memory access was encountered");
  ASSERT_TRUE(within(5000ms, [] { return FakeNccl::aborts > 0; }));
  try {
    f.allreduce();
    FAIL() << "an op after the device error ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("illegal memory access"), std::string::npos) << e.what();
  }
  f.path.reset();  // (must not throw from the destructor)
  EXPECT_EQ(FakeNccl::destroys, 0);
}

TEST(NcclWatchdog, APathDestroyedWithWorkOnABrokenDeviceAbortsWithoutThrowing) {
  NcclFixture f(30);
  FakeNccl::hold = true;
  f.allreduce();
  standInBreak(*f.dev, "CUDA error: unspecified launch failure");
  f.path.reset();
  EXPECT_EQ(FakeNccl::aborts, 1);
  EXPECT_EQ(FakeNccl::destroys, 0);
}

TEST(NcclWatchdog, ItsThreadMakesNoContextOnAnotherGpu) {
  NcclFixture f(30, /*devices=*/2, /*ordinal=*/1);
  f.allreduce();
  f.dev->synchronizeStream(nullptr);
  std::this_thread::sleep_for(300ms);  // (the watchdog polls)
  f.path.reset();
  EXPECT_EQ(standInContexts(*f.dev), std::vector<int>{1});
  EXPECT_EQ(FakeNccl::destroys, 1);
}

// Ranks on device 1 of a two-GPU host (as torch.cuda.set_device(1) makes it):
// collectives, their completion, and point-to-point touch device 1 only.
TEST(DeviceRules, RanksOnTheSecondGpuMakeNoContextOnTheFirst) {
  HostStandInOptions o;
  o.devices = 2;
  auto dev = makeHostStandIn(o);
  runRanksOk(2, [&](RankContext& c) {
    dev->setCurrent(1);
    DevBuf a(*dev, DataType::kFloat32, Shape{5000}, 1), into(*dev, DataType::kFloat32, Shape{5000}, 1);
    for (int64_t i = 0; i < 5000; ++i) a.host().set(i, c.rank + i);
    a.upload(nullptr);
    AllreduceOptions opts;
    opts.name = "ctx.sum";
    opts.op = ReduceOp::kSum;
    hostSees(c.rt.allreduceAsync(a.tensor(), a.tensor(), opts), *dev);
    for (int64_t i = 0; i < 5000; ++i) ASSERT_EQ(a.read(i), 1.0 + 2.0 * i) << i;
    SendRecvOptions so;
    if (c.rank == 0) c.rt.send(a.tensor(), 1, so);
    else c.rt.recv(into.tensor(), 0, so);
    dev->synchronizeStream(nullptr);
    if (c.rank == 1) {
      for (int64_t i = 0; i < 5000; ++i) ASSERT_EQ(into.read(i), 1.0 + 2.0 * i) << i;
    }
  }, withDevice(dev, "host"));
  EXPECT_EQ(standInContexts(*dev), std::vector<int>{1});
}

TEST(DeviceRules, AKernelOnAnotherDevicesStreamAndAForeignEventAreRefused) {
  HostStandInOptions o;
  o.devices = 2;
  auto dev = makeHostStandIn(o);
  dev->setCurrent(0);
  void* s1 = dev->createStream(1);
  void* e1 = dev->createEvent(1);
  void* buf = dev->allocDevice(1, 16);
  EXPECT_THROW(dev->scale(DataType::kFloat32, buf, buf, 4, 2.0, s1), Error);
  EXPECT_THROW(dev->record(e1, nullptr), Error);  // (the null stream is device 0's)
  dev->setCurrent(1);
  EXPECT_NO_THROW(dev->scale(DataType::kFloat32, buf, buf, 4, 2.0, s1));
  EXPECT_NO_THROW(dev->record(e1, nullptr));
  dev->synchronizeStream(s1);
  dev->synchronizeStream(nullptr);
  dev->freeDevice(buf);
  dev->destroyEvent(e1);
  dev->destroyStream(s1);
}

// A receive posted on a stream that still writes the tensor (earlier work of
// the caller's) lands after that work, not before it.
TEST(DeviceRules, ACudaReceiveLandsAfterWhatTheCallersStreamHeldAtThePost) {
  auto dev = makeHostStandIn();
  runRanksOk(2, [&](RankContext& c) {
    void* stream = dev->createStream(0);
    DevBuf mine(*dev, DataType::kFloat32, Shape{1000}), into(*dev, DataType::kFloat32, Shape{1000});
    for (int64_t i = 0; i < 1000; ++i) mine.host().set(i, 100.0 + i), into.host().set(i, -1.0);
    SendRecvOptions o;
    o.stream = stream;
    if (c.rank == 0) {
      mine.upload(stream);
      c.rt.send(mine.tensor(), 1, o);
    } else {
      into.upload(stream, 400ms);  // (the caller's late write of the tensor it then receives into)
      Work w = c.rt.recvAsync(into.tensor(), 0, o);
      w.wait();
      w.streamWait(stream);
      dev->synchronizeStream(stream);
      for (int64_t i = 0; i < 1000; ++i) ASSERT_EQ(into.read(i), 100.0 + i) << i;
    }
    dev->destroyStream(stream);
  }, withDevice(dev));
}

}  // namespace
}  // namespace chorus::testing
