#include "comm/mpi/mpi_communicator.h"

#include <climits>
#include <cstring>
#include <mutex>

#include "chorus/error.h"
#include "reduce/reduce.h"

namespace chorus {

namespace {

void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw PeerFailure(std::string("peer failure: ") + what + " failed: " + std::string(msg, len));
}

int asInt(size_t n, const char* what) {
  if (n > static_cast<size_t>(INT_MAX)) throw InvalidArgument(std::string(what) + ": more than 2^31 bytes per rank over MPI");
  return static_cast<int>(n);
}

// MPI has no float16/bfloat16: their reductions are user ops over 16-bit words.
template <DataType D, ReduceOp O>
void halfOp(void* in, void* inout, int* len, MPI_Datatype*) {
  reduceBuffers(D, O, inout, inout, in, static_cast<size_t>(*len));
}

MPI_Op halfOpFor(DataType dtype, ReduceOp op) {
  static MPI_Op ops[2][5];
  static std::once_flag once;
  std::call_once(once, [] {
    MPI_User_function* fns[2][5] = {
        {halfOp<DataType::kFloat16, ReduceOp::kSum>, halfOp<DataType::kFloat16, ReduceOp::kSum>,
         halfOp<DataType::kFloat16, ReduceOp::kMin>, halfOp<DataType::kFloat16, ReduceOp::kMax>,
         halfOp<DataType::kFloat16, ReduceOp::kProduct>},
        {halfOp<DataType::kBFloat16, ReduceOp::kSum>, halfOp<DataType::kBFloat16, ReduceOp::kSum>,
         halfOp<DataType::kBFloat16, ReduceOp::kMin>, halfOp<DataType::kBFloat16, ReduceOp::kMax>,
         halfOp<DataType::kBFloat16, ReduceOp::kProduct>}};
    for (int d = 0; d < 2; ++d)
      for (int o = 0; o < 5; ++o) MPI_Op_create(fns[d][o], 1, &ops[d][o]);
  });
  return ops[dtype == DataType::kBFloat16 ? 1 : 0][static_cast<int>(op)];
}

MPI_Datatype mpiType(DataType t) {
  switch (t) {
    case DataType::kUInt8:
    case DataType::kBool: return MPI_UINT8_T;
    case DataType::kInt8: return MPI_INT8_T;
    case DataType::kInt16: return MPI_INT16_T;
    case DataType::kUInt16: return MPI_UINT16_T;
    case DataType::kInt32: return MPI_INT32_T;
    case DataType::kInt64: return MPI_INT64_T;
    case DataType::kFloat16:
    case DataType::kBFloat16: return MPI_UINT16_T;
    case DataType::kFloat32: return MPI_FLOAT;
    case DataType::kFloat64: return MPI_DOUBLE;
  }
  return MPI_BYTE;
}

MPI_Op mpiOp(DataType t, ReduceOp op) {
  if (t == DataType::kFloat16 || t == DataType::kBFloat16) return halfOpFor(t, op);
  if (t == DataType::kBool) {  // 0/1 values: or is max, and is min
    return (op == ReduceOp::kMin || op == ReduceOp::kProduct) ? MPI_MIN : MPI_MAX;
  }
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage: return MPI_SUM;
    case ReduceOp::kMin: return MPI_MIN;
    case ReduceOp::kMax: return MPI_MAX;
    case ReduceOp::kProduct: return MPI_PROD;
    case ReduceOp::kAdasum: break;  // (the executor combines it; never reaches MPI)
  }
  return MPI_SUM;
}

}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm comm) : comm_(comm) {
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Comm_free(&comm_);
}

void MpiCommunicator::allreduce(void* buf, size_t count, DataType dtype, ReduceOp op) {
  if (count == 0 || size_ == 1) return;
  const size_t es = dtypeSize(dtype);
  char* p = static_cast<char*>(buf);
  for (size_t off = 0; off < count; off += INT_MAX / 2) {
    const int n = static_cast<int>(std::min<size_t>(INT_MAX / 2, count - off));
    check(MPI_Allreduce(MPI_IN_PLACE, p + off * es, n, mpiType(dtype), mpiOp(dtype, op), comm_), "MPI_Allreduce");
  }
}

void MpiCommunicator::allreduceBitsOr(uint64_t* words, size_t count) {
  if (count == 0 || size_ == 1) return;
  check(MPI_Allreduce(MPI_IN_PLACE, words, asInt(count, "control"), MPI_UINT64_T, MPI_BOR, comm_), "MPI_Allreduce");
}

void MpiCommunicator::allgatherv(const void* in, void* out, const std::vector<size_t>& bytes) {
  std::vector<int> counts(size_), displs(size_);
  size_t off = 0;
  for (int r = 0; r < size_; ++r) {
    counts[r] = asInt(bytes[r], "allgather");
    displs[r] = asInt(off, "allgather");
    off += bytes[r];
  }
  if (off == 0) return;
  check(MPI_Allgatherv(in, counts[rank_], MPI_BYTE, out, counts.data(), displs.data(), MPI_BYTE, comm_),
        "MPI_Allgatherv");
}

void MpiCommunicator::broadcast(void* buf, size_t bytes, int root) {
  char* p = static_cast<char*>(buf);
  for (size_t off = 0; off < bytes; off += INT_MAX / 2) {
    const int n = static_cast<int>(std::min<size_t>(INT_MAX / 2, bytes - off));
    check(MPI_Bcast(p + off, n, MPI_BYTE, root, comm_), "MPI_Bcast");
  }
}

void MpiCommunicator::alltoallv(const void* in, const std::vector<size_t>& sendBytes, void* out,
                                const std::vector<size_t>& recvBytes, size_t) {
  std::vector<int> sc(size_), sd(size_), rc(size_), rd(size_);
  size_t so = 0, ro = 0;
  for (int r = 0; r < size_; ++r) {
    sc[r] = asInt(sendBytes[r], "alltoall");
    sd[r] = asInt(so, "alltoall");
    rc[r] = asInt(recvBytes[r], "alltoall");
    rd[r] = asInt(ro, "alltoall");
    so += sendBytes[r];
    ro += recvBytes[r];
  }
  check(MPI_Alltoallv(in, sc.data(), sd.data(), MPI_BYTE, out, rc.data(), rd.data(), MPI_BYTE, comm_),
        "MPI_Alltoallv");
}

void MpiCommunicator::reducescatter(void* buf, void* out, const std::vector<size_t>& counts, DataType dtype,
                                    ReduceOp op) {
  std::vector<int> c(size_);
  size_t total = 0;
  for (int r = 0; r < size_; ++r) {
    c[r] = asInt(counts[r], "reducescatter");
    total += counts[r];
  }
  if (total == 0) return;
  check(MPI_Reduce_scatter(buf, out, c.data(), mpiType(dtype), mpiOp(dtype, op), comm_), "MPI_Reduce_scatter");
}

void MpiCommunicator::barrier() { check(MPI_Barrier(comm_), "MPI_Barrier"); }

}  // namespace chorus
