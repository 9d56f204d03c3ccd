#include "comm/hierarchical/hierarchical_communicator.h"

#include <cstring>
#include <numeric>

namespace chorus {

HierarchicalCommunicator::HierarchicalCommunicator(HierarchyLayout layout, std::unique_ptr<Communicator> local,
                                                   std::unique_ptr<Communicator> cross,
                                                   std::unique_ptr<Communicator> flat, bool hierarchicalAllreduce,
                                                   bool hierarchicalAllgather)
    : layout_(std::move(layout)),
      local_(std::move(local)),
      cross_(std::move(cross)),
      flat_(std::move(flat)),
      hierAllreduce_(hierarchicalAllreduce),
      hierAllgather_(hierarchicalAllgather) {}

// Reduce within the host, across the leaders, then hand the result back within the host.
void HierarchicalCommunicator::allreduce(void* buf, size_t count, DataType dtype, ReduceOp op) {
  if (!hierAllreduce_) return flat_->allreduce(buf, count, dtype, op);
  if (count == 0) return;
  local_->allreduce(buf, count, dtype, op);
  if (leader()) cross_->allreduce(buf, count, dtype, op);
  local_->broadcast(buf, count * dtypeSize(dtype), 0);
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
    std::vector<size_t> offset(bytes.size() + 1, 0);
    for (size_t r = 0; r < bytes.size(); ++r) offset[r + 1] = offset[r] + bytes[r];
    size_t pos = 0;
    for (const auto& h : hosts) {
      for (int r : h) {
        if (bytes[r]) std::memcpy(static_cast<char*>(out) + offset[r], scratch_.data() + pos, bytes[r]);
        pos += bytes[r];
      }
    }
  }
  local_->broadcast(out, total, 0);
}

void HierarchicalCommunicator::barrier() {
  local_->barrier();
  if (leader()) cross_->barrier();
  local_->barrier();
}

}  // namespace chorus
