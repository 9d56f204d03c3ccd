#pragma once
// Requests (what one rank asks for) and responses (what the coordinator decided).
#include <cstdint>
#include <string>
#include <vector>

#include "chorus/types.h"
#include "base/byte_io.h"

namespace chorus {

enum class OpType : uint8_t {
  kAllreduce = 0,
  kAllgather,
  kBroadcast,
  kAlltoall,
  kReducescatter,
  kBarrier,
  kJoin,
};
const char* opTypeName(OpType t);

struct Request {
  OpType type = OpType::kAllreduce;
  std::string name;
  DataType dtype = DataType::kFloat32;
  Shape shape;
  ReduceOp op = ReduceOp::kSum;
  int32_t root = -1;  // rank within the set (broadcast)
  double prescale = 1.0;
  double postscale = 1.0;
  int32_t priority = 0;
  std::string group;  // members of one grouped call share this key
  int32_t groupSize = 0;
  std::vector<int64_t> splits;  // alltoall: rows to each rank
  int64_t ageMs = 0;            // how long it waited locally before it was sent
  // A conflict marker (not a collective): the sender has this name in flight on
  // process set conflictSet while the set it is sent on waits for it.
  int32_t conflictSet = -1;
  int32_t device = kHostDevice;  // the tensor's (kHostDevice or a CUDA ordinal)

  // Same collective with the same parameters (what a cache hit requires).
  bool sameParams(const Request& o) const;
};

void writeRequests(const std::vector<Request>& reqs, ByteWriter& w);
std::vector<Request> readRequests(ByteReader& r);

enum class ErrorKind : uint8_t { kNone = 0, kMismatch, kInvalid, kStalled };

struct Response {
  OpType type = OpType::kAllreduce;
  std::string name;
  DataType dtype = DataType::kFloat32;
  Shape shape;  // for allgather/alltoall the shape without rank-specific rows
  ReduceOp op = ReduceOp::kSum;
  int32_t root = -1;
  double prescale = 1.0;
  double postscale = 1.0;
  int32_t priority = 0;
  std::vector<int64_t> rows;                 // allgather: first dim per rank
  std::vector<std::vector<int64_t>> splits;  // alltoall: splits[src][dst]
  int32_t lastJoined = -1;                   // join: rank within the set
  bool involvesJoined = false;               // some rank took part only as joined
  ErrorKind errorKind = ErrorKind::kNone;
  std::string error;
  std::vector<int32_t> conflictSets;  // sets the name was also in flight on (a conflict error)
  std::vector<int> markedRanks;       // set ranks whose part in a conflict was a marker
  bool onDevice = false;              // the tensors are CUDA tensors (on every rank)

  size_t bytes() const { return static_cast<size_t>(numElements(shape)) * dtypeSize(dtype); }
};

}  // namespace chorus
