#include "core/message.h"

namespace chorus {

const char* opTypeName(OpType t) {
  switch (t) {
    case OpType::kAllreduce: return "allreduce";
    case OpType::kAllgather: return "allgather";
    case OpType::kBroadcast: return "broadcast";
    case OpType::kAlltoall: return "alltoall";
    case OpType::kReducescatter: return "reducescatter";
    case OpType::kBarrier: return "barrier";
    case OpType::kJoin: return "join";
  }
  return "unknown";
}

bool Request::sameParams(const Request& o) const {
  return type == o.type && name == o.name && dtype == o.dtype && shape == o.shape && op == o.op &&
         root == o.root && prescale == o.prescale && postscale == o.postscale &&
         priority == o.priority && group == o.group && groupSize == o.groupSize &&
         splits == o.splits && device == o.device;
}

void writeRequests(const std::vector<Request>& reqs, ByteWriter& w) {
  w.put<uint32_t>(static_cast<uint32_t>(reqs.size()));
  for (const auto& q : reqs) {
    w.put<uint8_t>(static_cast<uint8_t>(q.type));
    w.putString(q.name);
    w.put<uint8_t>(static_cast<uint8_t>(q.dtype));
    w.putVector(q.shape);
    w.put<uint8_t>(static_cast<uint8_t>(q.op));
    w.put<int32_t>(q.root);
    w.put<double>(q.prescale);
    w.put<double>(q.postscale);
    w.put<int32_t>(q.priority);
    w.putString(q.group);
    w.put<int32_t>(q.groupSize);
    w.putVector(q.splits);
    w.put<int64_t>(q.ageMs);
    w.put<int32_t>(q.conflictSet);
    w.put<int32_t>(q.device);
  }
}

std::vector<Request> readRequests(ByteReader& r) {
  std::vector<Request> reqs(r.get<uint32_t>());
  for (auto& q : reqs) {
    q.type = static_cast<OpType>(r.get<uint8_t>());
    q.name = r.getString();
    q.dtype = static_cast<DataType>(r.get<uint8_t>());
    q.shape = r.getVector<int64_t>();
    q.op = static_cast<ReduceOp>(r.get<uint8_t>());
    q.root = r.get<int32_t>();
    q.prescale = r.get<double>();
    q.postscale = r.get<double>();
    q.priority = r.get<int32_t>();
    q.group = r.getString();
    q.groupSize = r.get<int32_t>();
    q.splits = r.getVector<int64_t>();
    q.ageMs = r.get<int64_t>();
    q.conflictSet = r.get<int32_t>();
    q.device = r.get<int32_t>();
  }
  return reqs;
}

}  // namespace chorus
