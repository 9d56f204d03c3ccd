#include "comm/hierarchical/hierarchical_communicator.h"

#include <cstring>
#include <numeric>

namespace chorus {

namespace {
// Below this, one cross-host op by the leaders costs less than one per local
// rank at once (latency-bound: 4 ranks on 2 simulated hosts, 64 KiB took
// 0.8 ms by the leaders and 1.8-2.0 ms by slices; from 1 MiB on slices were as
// fast or faster, and on real hosts they split the network work).
constexpr size_t kSlicedBytes = 1 << 20;

// Copies the pieces lying back to back in `from`, ranks in the given order, to
// their set-rank places in `out`.
void placePieces(const std::vector<int>& order, const std::vector<size_t>& bytes, const char* from, void* out) {
  std::vector<size_t> offset(bytes.size() + 1, 0);
  for (size_t r = 0; r < bytes.size(); ++r) offset[r + 1] = offset[r] + bytes[r];
  for (int r : order) {
    if (bytes[r]) std::memcpy(static_cast<char*>(out) + offset[r], from, bytes[r]);
    from += bytes[r];
  }
}
}  // namespace

HierarchicalCommunicator::HierarchicalCommunicator(HierarchyLayout layout, std::unique_ptr<Communicator> local,
                                                   std::unique_ptr<Communicator> cross,
                                                   std::unique_ptr<Communicator> flat, bool hierarchicalAllreduce,
                                                   bool hierarchicalAllgather)
    : layout_(std::move(layout)),
      local_(std::move(local)),
      cross_(std::move(cross)),
      flat_(std::move(flat)),
      hierAllreduce_(hierarchicalAllreduce),
      hierAllgather_(hierarchicalAllgather),
      sliced_(evenHosts(layout_.hostRanks) && local_->size() > 1) {}

// By slices (see the header), or: reduce within the host, across the leaders,
// then hand the result back within the host.
void HierarchicalCommunicator::allreduce(void* buf, size_t count, DataType dtype, ReduceOp op) {
  if (!hierAllreduce_) return flat_->allreduce(buf, count, dtype, op);
  if (count == 0) return;
  if (sliced() && count * dtypeSize(dtype) >= kSlicedBytes) return allreduceSliced(buf, count, dtype, op);
  local_->allreduce(buf, count, dtype, op);
  if (leader()) cross_->allreduce(buf, count, dtype, op);
  local_->broadcast(buf, count * dtypeSize(dtype), 0);
}

// Each host's data crosses the network once in slices, one per local rank, in
// parallel, and no host-wide broadcast follows. Every element is reduced in the
// same order on all ranks (within the host, then across hosts), so all get the
// same bits.
void HierarchicalCommunicator::allreduceSliced(void* buf, size_t count, DataType dtype, ReduceOp op) {
  const int n = local_->size(), me = local_->rank();
  const size_t es = dtypeSize(dtype);
  std::vector<size_t> counts(n), bytes(n);
  for (int j = 0; j < n; ++j) {
    counts[j] = count / n + (static_cast<size_t>(j) < count % n ? 1 : 0);
    bytes[j] = counts[j] * es;
  }
  slice_.resize(bytes[me]);
  local_->reducescatter(buf, slice_.data(), counts, dtype, op);
  cross_->allreduce(slice_.data(), counts[me], dtype, op);
  local_->allgatherv(slice_.data(), buf, bytes);
}

void HierarchicalCommunicator::allreduceBitsOr(uint64_t* words, size_t count) {
  local_->allreduceBitsOr(words, count);
  if (leader()) cross_->allreduceBitsOr(words, count);
  local_->broadcast(words, count * sizeof(uint64_t), 0);
}

// Gather within the host, exchange host blocks between leaders, lay the pieces
// out in set-rank order, and share the result within the host.
void HierarchicalCommunicator::allgatherv(const void* in, void* out, const std::vector<size_t>& bytes) {
  if (!hierAllgather_) return flat_->allgatherv(in, out, bytes);
  const size_t total = std::accumulate(bytes.begin(), bytes.end(), size_t{0});
  if (total == 0) return;
  if (sliced() && total >= kSlicedBytes) return allgatherSliced(in, out, bytes, total);
  const auto& hosts = layout_.hostRanks;
  const auto& mine = hosts[layout_.host];
  std::vector<size_t> localBytes;
  for (int r : mine) localBytes.push_back(bytes[r]);
  std::vector<size_t> hostBytes;
  for (const auto& h : hosts) {
    size_t b = 0;
    for (int r : h) b += bytes[r];
    hostBytes.push_back(b);
  }
  scratch_.resize(std::max<size_t>(total, 1));
  // Host blocks land in scratch in host order: [host 0 ranks...][host 1 ranks...]...
  size_t hostOff = 0;
  for (int h = 0; h < layout_.host; ++h) hostOff += hostBytes[h];
  local_->allgatherv(in, scratch_.data() + hostOff, localBytes);
  if (leader()) {
    std::vector<char> mineBlock(scratch_.begin() + hostOff, scratch_.begin() + hostOff + hostBytes[layout_.host]);
    cross_->allgatherv(mineBlock.data(), scratch_.data(), hostBytes);
    std::vector<int> order;  // host by host
    for (const auto& h : hosts) order.insert(order.end(), h.begin(), h.end());
    placePieces(order, bytes, scratch_.data(), out);
  }
  local_->broadcast(out, total, 0);
}

// Each rank exchanges its own piece with the ranks of its local index on the
// other hosts, then the host's ranks share what they received, and the pieces
// are laid out in set-rank order: no rank carries the whole host's data across.
void HierarchicalCommunicator::allgatherSliced(const void* in, void* out, const std::vector<size_t>& bytes,
                                               size_t total) {
  const auto& hosts = layout_.hostRanks;
  const int H = static_cast<int>(hosts.size()), L = local_->size(), me = local_->rank();
  std::vector<size_t> crossBytes(H), localBytes(L, 0);
  for (int i = 0; i < L; ++i)
    for (int h = 0; h < H; ++h) localBytes[i] += bytes[hosts[h][i]];
  for (int h = 0; h < H; ++h) crossBytes[h] = bytes[hosts[h][me]];
  slice_.resize(std::max<size_t>(localBytes[me], 1));
  cross_->allgatherv(in, slice_.data(), crossBytes);  // cross ranks are host indices
  scratch_.resize(total);
  local_->allgatherv(slice_.data(), scratch_.data(), localBytes);
  std::vector<int> order;  // local index by local index, hosts within each
  for (int i = 0; i < L; ++i)
    for (int h = 0; h < H; ++h) order.push_back(hosts[h][i]);
  placePieces(order, bytes, scratch_.data(), out);
}

void HierarchicalCommunicator::barrier() {
  local_->barrier();
  if (leader()) cross_->barrier();
  local_->barrier();
}

}  // namespace chorus
