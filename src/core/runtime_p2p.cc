// Point-to-point ops of the Runtime: checked here, carried by src/comm's PointToPoint.
#include <algorithm>

#include "chorus/error.h"
#include "core/process_set_table.h"
#include "core/runtime_impl.h"
#include "core/work_state.h"

namespace chorus {

void RuntimeImpl::startP2p() {
  P2pOptions o;
  o.bindAddress = config.bindAddress;
  o.iface = config.iface;
  o.timeout = std::chrono::milliseconds(static_cast<int64_t>(config.timeoutSeconds * 1000));
  o.connectTimeout = std::chrono::milliseconds(static_cast<int64_t>(config.startTimeoutSeconds * 1000));
  o.crossMemoryAttach = config.shmSingleCopy;
  o.sharedMemoryRings = !config.shmDisable;
  o.jobId = config.jobId;
  // Under CHORUS_CPU_OPERATIONS=mpi, MPI carries large messages between hosts too.
  std::unique_ptr<P2pBulk> bulk = config.cpuOperations == "mpi" && mpiWorld() ? mpi_->p2pBulk() : nullptr;
  p2p = makePointToPoint(*store, prefix, rank, hosts, o, std::move(bulk));
  PointToPoint* engine = p2p.get();
  p2pDriver = std::make_shared<CycleDriver>(
      CycleDriver::Hooks{[engine](const std::function<bool()>& done) { return engine->drive(done); }, nullptr});
}

void RuntimeImpl::stopP2p() {
  if (p2pDriver) p2pDriver->detach();  // returns once no waiter is inside the engine
  if (p2p) p2p->shutdown();
  p2p.reset();
  p2pDriver.reset();
  releaseCopiesUp(true);
  p2pStreams.clear();
}

void RuntimeImpl::releaseCopiesUp(bool wait) {
  std::lock_guard<std::mutex> lock(copiesMu);
  while (!copiesUp.empty()) {
    DeviceEvent& e = *copiesUp.front().done;
    CurrentDevice on(e.backend(), e.ordinal());
    if (wait) e.backend().synchronize(e.get());
    else if (!e.backend().query(e.get())) break;  // (in order: one side stream per device)
    copiesUp.pop_front();
  }
}

std::vector<Work> RuntimeImpl::postP2p(const std::vector<P2pOp>& ops, int32_t setId, void* stream) {
  requireInit();
  const ProcessSet ps = sets.get(setId);
  auto where = [&] { return "process set " + std::to_string(setId) + " (ranks " + listString(ps.ranks()) + ")"; };
  if (!ps.included())
    throw InvalidArgument("point-to-point: rank " + std::to_string(rank) + " is not in " + where());
  if (setId == kGlobalProcessSetId)  // (the set's members are every rank)
    for (const auto& op : ops)
      if (op.peer < 0 || op.peer >= size)
        throw InvalidArgument("point-to-point: rank " + std::to_string(rank) + " cannot " +
                              (op.send ? "send to" : "receive from") + " rank " + std::to_string(op.peer) +
                              " (the job has " + std::to_string(size) + " ranks)");
  releaseCopiesUp(false);
  std::vector<P2pRequest> reqs;
  std::vector<Work> works;
  reqs.reserve(ops.size());
  works.reserve(ops.size());
  for (const auto& op : ops) {
    const auto& members = ps.ranks();
    if (setId != kGlobalProcessSetId && std::find(members.begin(), members.end(), op.peer) == members.end())
      throw InvalidArgument("point-to-point: rank " + std::to_string(rank) + " cannot " +
                            (op.send ? "send to" : "receive from") + " rank " + std::to_string(op.peer) +
                            ", which is not in " + where());
    if (op.peer == rank)
      throw InvalidArgument("point-to-point: rank " + std::to_string(rank) + " cannot " +
                            (op.send ? "send to" : "receive from") + " itself");
    if (op.tensor.numel() < 0 || (op.tensor.numel() > 0 && !op.tensor.data))
      throw InvalidArgument("point-to-point: a tensor of shape " + shapeString(op.tensor.shape) + " has no data");
    auto work = std::make_shared<WorkState>(1);
    work->driver = p2pDriver;
    work->outputs = {op.tensor};
    P2pRequest r;
    r.send = op.send;
    r.data = op.tensor.data;
    std::function<void()> landed;  // a CUDA receive: its copy up
    if (op.tensor.device >= 0) {
      auto b = deviceBackend();
      const int dev = op.tensor.device;
      CurrentDevice on(*b, dev);  // (the caller's null stream is its device's)
      const size_t bytes = op.tensor.bytes();
      std::shared_ptr<void> pinned(b->allocPinned(bytes), [b](void* p) {
        try {
          b->freePinned(p);
        } catch (...) {
        }
      });
      work->owned.push_back(pinned);
      r.data = pinned.get();
      work->deviceDone = std::make_shared<DeviceEvent>(b, dev);
      if (op.send) {  // (host-synchronous: the bytes must be down before they go)
        b->copy(pinned.get(), op.tensor.data, bytes, stream);
        b->record(work->deviceDone->get(), stream);
        b->synchronize(work->deviceDone->get());
      } else {
        auto& side = p2pStreams[dev];
        if (!side) side = std::make_shared<DeviceStream>(b, dev);
        // The copy up waits for what the caller's stream held at the post (earlier
        // writes to the tensor; a block its allocator recycles).
        auto posted = std::make_shared<DeviceEvent>(b, dev);
        b->record(posted->get(), stream);
        void* dst = op.tensor.data;
        landed = [this, b, dev, side, posted, dst, pinned, bytes, work] {
          CurrentDevice on(*b, dev);  // (the point-to-point thread's)
          b->streamWait(side->get(), posted->get());
          b->copy(dst, pinned.get(), bytes, side->get());
          b->record(work->deviceDone->get(), side->get());
          std::lock_guard<std::mutex> lock(copiesMu);
          copiesUp.push_back({work->deviceDone, pinned});
        };
      }
    }
    r.bytes = op.tensor.bytes();
    r.dtype = op.tensor.dtype;
    r.peer = op.peer;
    r.processSet = setId;
    r.tag = op.tag;
    r.done = [work, landed](std::exception_ptr err) {
      if (!err && landed) {
        try {
          landed();
        } catch (...) {
          err = std::current_exception();
        }
      }
      work->complete(err);
    };
    reqs.push_back(std::move(r));
    works.emplace_back(work);
    track(work);
  }
  p2p->post(std::move(reqs));
  return works;
}

Work Runtime::sendAsync(const Tensor& tensor, int dst, const SendRecvOptions& opts) {
  return impl_->postP2p({P2pOp{true, tensor, dst, opts.tag}}, opts.processSet, opts.stream).front();
}

Work Runtime::recvAsync(const Tensor& tensor, int src, const SendRecvOptions& opts) {
  return impl_->postP2p({P2pOp{false, tensor, src, opts.tag}}, opts.processSet, opts.stream).front();
}

std::vector<Work> Runtime::batchSendRecvAsync(const std::vector<P2pOp>& ops, int32_t processSet, void* stream) {
  return impl_->postP2p(ops, processSet, stream);
}

void Runtime::send(const Tensor& tensor, int dst, const SendRecvOptions& opts) { sendAsync(tensor, dst, opts).wait(); }

void Runtime::recv(const Tensor& tensor, int src, const SendRecvOptions& opts) {
  Work w = recvAsync(tensor, src, opts);
  w.wait();
  w.streamWait(opts.stream);  // (CUDA: the caller's stream sees the data)
}

}  // namespace chorus
