#include "comm/gloo/gloo_communicator.h"

#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/alltoallv.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/types.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <cstring>
#include <numeric>

#include "chorus/error.h"
#include "comm/gloo/gloo_store_adapter.h"
#include "reduce/reduce.h"

namespace chorus {

namespace {

// Gloo reports both a dead peer and a deadline as IoException; the text tells them apart.
template <typename F>
void guarded(const char* what, int rank, F&& f) {
  try {
    f();
  } catch (const gloo::IoException& e) {
    std::string msg = std::string(what) + " failed on rank " + std::to_string(rank) + ": " + e.what();
    if (std::strstr(e.what(), "Timed out") || std::strstr(e.what(), "timed out")) throw Timeout(msg);
    throw PeerFailure("peer failure: " + msg);
  } catch (const gloo::Exception& e) {
    throw PeerFailure("peer failure: " + std::string(what) + " failed on rank " +
                      std::to_string(rank) + ": " + e.what());
  } catch (const chorus::Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error(std::string(what) + " failed on rank " + std::to_string(rank) + ": " + e.what());
  }
}

// Gloo wants non-null buffers even for empty pieces.
char gEmpty[8];
void* nonNull(void* p) { return p ? p : gEmpty; }

constexpr uint8_t kReduceScatterSlotPrefix = 0x7c;
// Collectives in which no rank sends more than this go over the direct mesh.
// 2 ranks on a 2-core VM, against Gloo: allreduce 1 MiB 1.1 against 4.4 ms,
// 2 MiB 2.7-3.4 against 4.5-4.8 ms, 4 MiB 7.9-8.9 against 7.0-7.8 ms; allgather
// and alltoall of 4 MiB (2 MiB sent) 1.7 against 2.5-2.6 ms.
constexpr size_t kMeshMaxSend = 2 << 20;

// One message to and from every other rank over the mesh: to(p) is what goes to
// rank p, from(p) where rank p's message lands.
template <typename To, typename From>
void exchangeWithAll(DirectMesh& mesh, int n, int me, To&& to, From&& from) {
  std::vector<DirectMesh::Transfer> sends, recvs;
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    sends.push_back(to(p));
    recvs.push_back(from(p));
  }
  mesh.run(sends, recvs);
}
using Transfer = DirectMesh::Transfer;

}  // namespace

void GlooCommunicator::exchangeReduce(void* buf, size_t bytes,
                                      const std::function<void(void*, const void*, size_t)>& reduceInto) {
  const int n = size(), me = rank();
  gather_.resize(bytes * n);
  exchangeWithAll(
      *mesh_, n, me, [&](int p) { return Transfer{p, static_cast<char*>(buf), bytes}; },
      [&](int p) { return Transfer{p, gather_.data() + p * bytes, bytes}; });
  std::memcpy(gather_.data() + me * bytes, buf, bytes);
  // The same order on every rank, so every rank gets bit-identical results.
  std::memcpy(buf, gather_.data(), bytes);
  for (int p = 1; p < n; ++p) reduceInto(buf, gather_.data() + p * bytes, bytes);
}

// Each rank sends every segment but one to the next rank twice, once to reduce
// and once to share the result; both directions of every link at once. Chunks
// bound the receive buffer and let the kernel move one while the last is reduced.
// Every rank gets the segment owner's bits. Against Gloo's ring allreduce (its
// event-loop thread, a handshake per message), float32, builds alternated: 2 ranks
// on loopback 4-64 MiB 3.7-70 against 5.5-93 ms; across two namespace hosts (veth,
// 2 vCPUs) 1 rank per host 0.54-0.77 against 0.46-0.54 GB/s, 2 x 2 ranks (the
// hierarchical path) 0.35-0.51 against 0.32-0.40 GB/s.
void GlooCommunicator::ringAllreduce(void* buf, size_t count, DataType dtype, ReduceOp op) {
  constexpr size_t kChunk = 1 << 20;  // 4 MiB was level across the namespace hosts
  const int n = size(), me = rank(), next = (me + 1) % n, prev = (me + n - 1) % n;
  const size_t esize = dtypeSize(dtype);
  char* data = static_cast<char*>(buf);
  auto segStart = [&](int s) { return count * static_cast<size_t>(s) / n * esize; };
  auto segEnd = [&](int s) { return count * static_cast<size_t>(s + 1) / n * esize; };
  gather_.resize(kChunk);
  for (int step = 0; step < n - 1; ++step) {  // reduce-scatter
    const int sendSeg = ((me - step) % n + n) % n, recvSeg = ((me - step - 1) % n + n) % n;
    const size_t sendLen = segEnd(sendSeg) - segStart(sendSeg), recvLen = segEnd(recvSeg) - segStart(recvSeg);
    for (size_t at = 0; at < std::max(sendLen, recvLen); at += kChunk) {
      const size_t s = at < sendLen ? std::min(kChunk, sendLen - at) : 0;
      const size_t r = at < recvLen ? std::min(kChunk, recvLen - at) : 0;
      mesh_->run({{next, data + segStart(sendSeg) + at, s}}, {{prev, gather_.data(), r}});
      char* into = data + segStart(recvSeg) + at;
      if (r) reduceBuffers(dtype, op, into, into, gather_.data(), r / esize);
    }
  }
  for (int step = 0; step < n - 1; ++step) {  // allgather of the reduced segments
    const int sendSeg = ((me + 1 - step) % n + n) % n, recvSeg = ((me - step) % n + n) % n;
    const size_t sendLen = segEnd(sendSeg) - segStart(sendSeg), recvLen = segEnd(recvSeg) - segStart(recvSeg);
    mesh_->run({{next, data + segStart(sendSeg), sendLen}}, {{prev, data + segStart(recvSeg), recvLen}});
  }
}

void GlooCommunicator::allreduce(void* buf, size_t count, DataType dtype, ReduceOp op) {
  if (count == 0 || size() == 1) return;
  const size_t esize = dtypeSize(dtype);
  if (count * esize * (size() - 1) <= kMeshMaxSend) {
    guarded("allreduce", rank(), [&] {
      exchangeReduce(buf, count * esize, [&](void* acc, const void* other, size_t bytes) {
        reduceBuffers(dtype, op, acc, acc, other, bytes / esize);
      });
    });
    return;
  }
  guarded("allreduce", rank(), [&] { ringAllreduce(buf, count, dtype, op); });
}

void GlooCommunicator::allreduceBitsOr(uint64_t* words, size_t count) {
  if (count == 0 || size() == 1) return;
  guarded("control allreduce", rank(), [&] {
    if (count * 8 * (size() - 1) <= kMeshMaxSend) {
      exchangeReduce(words, count * 8, [](void* acc, const void* other, size_t bytes) {
        auto* a = static_cast<uint64_t*>(acc);
        auto* b = static_cast<const uint64_t*>(other);
        for (size_t i = 0; i < bytes / 8; ++i) a[i] |= b[i];
      });
      return;
    }
    gloo::AllreduceOptions opts(ctx_);
    opts.setTimeout(timeout_);
    opts.setOutput(words, count);
    opts.setReduceFunction([](void* out, const void* a, const void* b, size_t n) {
      auto* o = static_cast<uint64_t*>(out);
      auto* x = static_cast<const uint64_t*>(a);
      auto* y = static_cast<const uint64_t*>(b);
      for (size_t i = 0; i < n; ++i) o[i] = x[i] | y[i];
    });
    gloo::allreduce(opts);
  });
}

void GlooCommunicator::allgatherv(const void* in, void* out, const std::vector<size_t>& bytes) {
  const size_t total = std::accumulate(bytes.begin(), bytes.end(), size_t{0});
  if (total == 0) return;
  if (size() == 1) {
    if (out != in) std::memcpy(out, in, bytes[0]);
    return;
  }
  if (*std::max_element(bytes.begin(), bytes.end()) * (size() - 1) <= kMeshMaxSend) {
    const int me = rank();
    std::vector<size_t> at(size(), 0);
    for (int p = 1; p < size(); ++p) at[p] = at[p - 1] + bytes[p - 1];
    char* dst = static_cast<char*>(out);
    if (bytes[me] && dst + at[me] != in) std::memcpy(dst + at[me], in, bytes[me]);
    exchangeWithAll(
        *mesh_, size(), me, [&](int p) { return Transfer{p, static_cast<char*>(const_cast<void*>(in)), bytes[me]}; },
        [&](int p) { return Transfer{p, dst + at[p], bytes[p]}; });
    return;
  }
  guarded("allgather", rank(), [&] {
    gloo::AllgathervOptions opts(ctx_);
    opts.setTimeout(timeout_);
    opts.setInput(static_cast<char*>(nonNull(const_cast<void*>(in))), bytes[rank()]);
    opts.setOutput(static_cast<char*>(out), bytes);
    gloo::allgatherv(opts);
  });
}

void GlooCommunicator::broadcast(void* buf, size_t bytes, int root) {
  if (bytes == 0 || size() == 1) return;
  if (bytes * (size() - 1) <= kMeshMaxSend) {
    std::vector<Transfer> sends, recvs;
    if (rank() == root) {
      for (int p = 0; p < size(); ++p)
        if (p != root) sends.push_back({p, static_cast<char*>(buf), bytes});
    } else {
      recvs.push_back({root, static_cast<char*>(buf), bytes});
    }
    mesh_->run(sends, recvs);
    return;
  }
  guarded("broadcast", rank(), [&] {
    gloo::BroadcastOptions opts(ctx_);
    opts.setTimeout(timeout_);
    opts.setRoot(root);
    opts.setOutput(static_cast<char*>(buf), bytes);
    gloo::broadcast(opts);
  });
}

void GlooCommunicator::alltoallv(const void* in, const std::vector<size_t>& sendBytes, void* out,
                                 const std::vector<size_t>& recvBytes, size_t largestPiece) {
  if (size() == 1) {
    if (sendBytes[0]) std::memcpy(out, in, sendBytes[0]);
    return;
  }
  if (largestPiece * (size() - 1) <= kMeshMaxSend) {  // the same choice on every rank
    const int me = rank();
    std::vector<size_t> s(size(), 0), r(size(), 0);
    for (int p = 1; p < size(); ++p) {
      s[p] = s[p - 1] + sendBytes[p - 1];
      r[p] = r[p - 1] + recvBytes[p - 1];
    }
    char* src = static_cast<char*>(const_cast<void*>(in));
    char* dst = static_cast<char*>(out);
    if (sendBytes[me]) std::memcpy(dst + r[me], src + s[me], sendBytes[me]);
    exchangeWithAll(
        *mesh_, size(), me, [&](int p) { return Transfer{p, src + s[p], sendBytes[p]}; },
        [&](int p) { return Transfer{p, dst + r[p], recvBytes[p]}; });
    return;
  }
  const size_t sendTotal = std::accumulate(sendBytes.begin(), sendBytes.end(), size_t{0});
  const size_t recvTotal = std::accumulate(recvBytes.begin(), recvBytes.end(), size_t{0});
  guarded("alltoall", rank(), [&] {
    gloo::AlltoallvOptions opts(ctx_);
    opts.setTimeout(timeout_);
    std::vector<int64_t> s(sendBytes.begin(), sendBytes.end());
    std::vector<int64_t> r(recvBytes.begin(), recvBytes.end());
    opts.setInput(static_cast<char*>(sendTotal ? const_cast<void*>(in) : gEmpty), s);
    opts.setOutput(static_cast<char*>(recvTotal ? out : gEmpty), r);
    gloo::alltoallv(opts);
  });
}

// Ring reduce-scatter: n-1 steps, each sending one piece right and reducing the
// piece that arrives from the left, so every rank moves (n-1)/n of the data once.
void GlooCommunicator::reducescatter(void* buf, void* out, const std::vector<size_t>& counts,
                                     DataType dtype, ReduceOp op) {
  const int n = size();
  const int r = rank();
  const size_t esize = dtypeSize(dtype);
  std::vector<size_t> offset(n + 1, 0);
  for (int i = 0; i < n; ++i) offset[i + 1] = offset[i] + counts[i] * esize;
  if (n > 1 && offset[n] > 0 && offset[n] <= kMeshMaxSend) {
    // Every rank sends each piece straight to its owner, which reduces them in rank order.
    const size_t mine = offset[r + 1] - offset[r];
    gather_.resize(mine * n);
    exchangeWithAll(
        *mesh_, n, r, [&](int p) { return Transfer{p, static_cast<char*>(buf) + offset[p], offset[p + 1] - offset[p]}; },
        [&](int p) { return Transfer{p, gather_.data() + p * mine, mine}; });
    if (mine == 0) return;
    std::memcpy(gather_.data() + r * mine, static_cast<char*>(buf) + offset[r], mine);
    std::memcpy(out, gather_.data(), mine);
    for (int p = 1; p < n; ++p) reduceBuffers(dtype, op, out, out, gather_.data() + p * mine, mine / esize);
    return;
  }
  if (n > 1 && offset[n] > 0) {
    size_t maxPiece = *std::max_element(counts.begin(), counts.end()) * esize;
    if (recvScratch_.size() < maxPiece) recvScratch_.resize(maxPiece);
    guarded("reducescatter", r, [&] {
      auto sendBuf = ctx_->createUnboundBuffer(buf, offset[n]);
      auto recvBuf = ctx_->createUnboundBuffer(recvScratch_.data(), recvScratch_.size());
      const int right = (r + 1) % n, left = (r - 1 + n) % n;
      for (int s = 0; s < n - 1; ++s) {
        const int sendIdx = ((r - s - 1) % n + n) % n;
        const int recvIdx = ((r - s - 2) % n + n) % n;
        const size_t sendLen = offset[sendIdx + 1] - offset[sendIdx];
        const size_t recvLen = offset[recvIdx + 1] - offset[recvIdx];
        const uint64_t slot = gloo::Slot::build(kReduceScatterSlotPrefix, static_cast<uint32_t>(s));
        if (sendLen) sendBuf->send(right, slot, offset[sendIdx], sendLen);
        if (recvLen) recvBuf->recv(left, slot, 0, recvLen);
        if (recvLen) recvBuf->waitRecv(timeout_);
        if (sendLen) sendBuf->waitSend(timeout_);
        if (recvLen) {
          char* dst = static_cast<char*>(buf) + offset[recvIdx];
          reduceBuffers(dtype, op, dst, dst, recvScratch_.data(), recvLen / esize);
        }
      }
    });
  }
  const size_t mine = offset[r + 1] - offset[r];
  if (mine) std::memcpy(out, static_cast<char*>(buf) + offset[r], mine);
}

// Everyone sends everyone an empty message: nobody gets all of them before all have sent.
void GlooCommunicator::barrier() {
  if (size() == 1) return;
  auto empty = [](int p) { return Transfer{p, nullptr, 0}; };
  exchangeWithAll(*mesh_, size(), rank(), empty, empty);
}

std::shared_ptr<TransportDevice> makeTransportDevice(const CommOptions& opts) {
  gloo::transport::tcp::attr attr;
  if (!opts.iface.empty()) {
    attr.iface = opts.iface;
  } else {
    attr.hostname = opts.bindAddress.empty() ? "127.0.0.1" : opts.bindAddress;
  }
  auto dev = std::make_shared<TransportDevice>();
  try {
    dev->gloo = gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    throw InvalidArgument("cannot open the TCP transport on " +
                          (attr.iface.empty() ? "address " + attr.hostname : "interface " + attr.iface) +
                          ": " + e.what());
  }
  return dev;
}

std::unique_ptr<Communicator> makeTcpCommunicator(const std::shared_ptr<TransportDevice>& device,
                                                  Store& store, const std::string& storePrefix,
                                                  int rank, int size, const CommOptions& opts) {
  auto connectTimeout = std::chrono::milliseconds(static_cast<int64_t>(opts.connectTimeoutSeconds * 1000));
  auto opTimeout = std::chrono::milliseconds(static_cast<int64_t>(opts.timeoutSeconds * 1000));
  auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
  ctx->setTimeout(connectTimeout);
  GlooStoreAdapter adapter(store, storePrefix, connectTimeout);
  guarded("connecting the TCP mesh", rank, [&] { ctx->connectFullMesh(adapter, device->gloo); });
  ctx->setTimeout(opTimeout);
  std::unique_ptr<DirectMesh> mesh;
  if (size > 1)
    mesh = std::make_unique<DirectMesh>(store, storePrefix, rank, size,
                                        opts.bindAddress.empty() ? "127.0.0.1" : opts.bindAddress, opts.iface,
                                        connectTimeout, opTimeout, opts.globalRanks);
  return std::make_unique<GlooCommunicator>(std::move(ctx), std::move(mesh), opTimeout);
}

}  // namespace chorus
