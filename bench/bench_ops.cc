#include "bench_ops.h"

#include <cmath>
#include <cstring>

#include "reduce/cast.h"

namespace chorus::bench {

namespace {

double genValue(int rank, int64_t i, DataType dt, ReduceOp op) {
  if (dt == DataType::kBool) return ((i + rank) % 3 == 0) ? 1 : 0;
  if (op == ReduceOp::kProduct) return 1 + (i + rank) % 2;
  if (dt == DataType::kUInt8 || dt == DataType::kUInt16) return static_cast<double>((i * 3 + rank * 5) % 11);
  return static_cast<double>((i * 3 + rank * 5) % 11 - 5);
}

double load(const char* p, DataType dt, int64_t i) { return elementToDouble(p, dt, static_cast<size_t>(i)); }

void store(char* p, DataType dt, int64_t i, double v) { elementFromDouble(p, dt, static_cast<size_t>(i), v); }

bool isInteger(DataType dt) {
  return dt == DataType::kUInt8 || dt == DataType::kInt8 || dt == DataType::kInt16 || dt == DataType::kUInt16 ||
         dt == DataType::kInt32 || dt == DataType::kInt64;
}

double reduceAll(ReduceOp op, DataType dt, int n, int64_t i) {
  if (dt == DataType::kBool) {
    bool any = false, all = true;
    for (int r = 0; r < n; ++r) {
      bool v = genValue(r, i, dt, op) != 0;
      any |= v;
      all &= v;
    }
    return (op == ReduceOp::kMin || op == ReduceOp::kProduct) ? all : any;
  }
  double acc = genValue(0, i, dt, op);
  for (int r = 1; r < n; ++r) {
    double v = genValue(r, i, dt, op);
    if (op == ReduceOp::kSum || op == ReduceOp::kAverage) acc += v;
    if (op == ReduceOp::kMin) acc = std::min(acc, v);
    if (op == ReduceOp::kMax) acc = std::max(acc, v);
    if (op == ReduceOp::kProduct) acc *= v;
  }
  if (op == ReduceOp::kAverage) acc = isInteger(dt) ? static_cast<double>(static_cast<int64_t>(acc) / n) : acc / n;
  return acc;
}

}  // namespace

const char* benchOpName(BenchOp op) {
  switch (op) {
    case BenchOp::kAllreduce: return "allreduce";
    case BenchOp::kAllgather: return "allgather";
    case BenchOp::kBroadcast: return "broadcast";
    case BenchOp::kAlltoall: return "alltoall";
    case BenchOp::kReducescatter: return "reducescatter";
  }
  return "?";
}

BenchOp parseBenchOp(const std::string& name) {
  for (BenchOp op : {BenchOp::kAllreduce, BenchOp::kAllgather, BenchOp::kBroadcast, BenchOp::kAlltoall,
                     BenchOp::kReducescatter})
    if (name == benchOpName(op)) return op;
  throw InvalidArgument("unknown op '" + name + "' (allreduce, allgather, broadcast, alltoall, reducescatter)");
}

double busFactor(BenchOp op, int n) {
  switch (op) {
    case BenchOp::kAllreduce: return 2.0 * (n - 1) / n;
    case BenchOp::kBroadcast: return 1.0;
    default: return static_cast<double>(n - 1) / n;
  }
}

BenchCase::BenchCase(Runtime& rt, BenchOp op, DataType dtype, ReduceOp redop, size_t bytes, int sets, BufferOwners owners)
    : rt_(rt), op_(op), dtype_(dtype), redop_(redop), rank_(rt.rank()), size_(rt.size()),
      chorusOutputs_(owners.chorusOutputs && op != BenchOp::kAllreduce && op != BenchOp::kBroadcast) {
  const size_t es = dtypeSize(dtype);
  int64_t elems = static_cast<int64_t>(bytes / es);
  const bool perRank = op == BenchOp::kAllgather || op == BenchOp::kReducescatter || op == BenchOp::kAlltoall;
  if (perRank) elems -= elems % size_;
  bytes_ = static_cast<size_t>(elems) * es;
  switch (op) {
    case BenchOp::kAllgather:
      count_ = elems / size_;
      outCount_ = elems;
      break;
    case BenchOp::kReducescatter:
      count_ = elems;
      outCount_ = elems / size_;
      break;
    default:
      count_ = elems;
      outCount_ = elems;
  }
  auto buffer = [](size_t bytes, bool shared) -> std::shared_ptr<void> {
    return shared ? allocateShared(bytes) : std::shared_ptr<char[]>(new char[bytes]());
  };
  for (int k = 0; k < std::max(sets, 1); ++k) in_.push_back(buffer(std::max<size_t>(count_ * es, 1), owners.sharedInputs));
  if (chorusOutputs_) {
    held_.resize(std::max(sets, 1));
  } else {
    // Allreduce with chorus outputs writes into buffers from chorus's allocator,
    // as for the new tensor of Horovod's hvd.allreduce.
    const bool shared = owners.chorusOutputs && op == BenchOp::kAllreduce;
    for (int k = 0; k < std::max(sets, 1); ++k) out_.push_back(buffer(std::max<size_t>(outCount_ * es, 1), shared));
  }
  name_ = std::string("bench.") + benchOpName(op) + "." + std::to_string(bytes_);
}

// The Work replaced is released after the new op allocated its output, so the
// pool hands out sets + 1 buffers in turn.
void BenchCase::hold(int i, Work w) {
  if (!held_.empty()) held_[i % held_.size()].emplace(std::move(w));
}

const char* BenchCase::output0() const {
  if (chorusOutputs_) return static_cast<const char*>(held_[0]->outputs().at(0).data);
  return static_cast<const char*>(out_[0].get());
}

void BenchCase::run(int i) {
  char* inBuf = static_cast<char*>(in_[i % in_.size()].get());
  Tensor in{inBuf, dtype_, {count_}};
  // Broadcast and allreduce write their own buffers (never chorus-allocated).
  char* outBuf = chorusOutputs_ ? inBuf : static_cast<char*>(out_[i % out_.size()].get());
  Tensor out{outBuf, dtype_, {outCount_}};
  Allocator into = [outBuf](const Shape&, DataType) -> void* { return outBuf; };
  if (chorusOutputs_) into = nullptr;
  OpOptions o;
  o.name = name_;
  switch (op_) {
    case BenchOp::kAllreduce: {
      AllreduceOptions ao;
      ao.name = name_;
      ao.op = redop_;
      rt_.allreduce(in, out, ao);
      break;
    }
    case BenchOp::kAllgather: hold(i, rt_.allgather(in, o, into)); break;
    case BenchOp::kBroadcast: rt_.broadcast(out, 0, o); break;
    case BenchOp::kAlltoall: hold(i, rt_.alltoall(in, {}, o, into)); break;
    case BenchOp::kReducescatter: {
      ReducescatterOptions ro;
      ro.name = name_;
      ro.op = redop_ == ReduceOp::kAverage ? ReduceOp::kAverage : ReduceOp::kSum;
      hold(i, rt_.reducescatter(in, ro, into));
      break;
    }
  }
}

void BenchCase::fillInput() {
  for (int64_t i = 0; i < count_; ++i) store(static_cast<char*>(in_[0].get()), dtype_, i, genValue(rank_, i, dtype_, redop_));
  if (op_ == BenchOp::kBroadcast)
    for (int64_t i = 0; i < count_; ++i) store(static_cast<char*>(out_[0].get()), dtype_, i, genValue(rank_, i, dtype_, redop_));
}

double BenchCase::expected(int64_t j) const {
  switch (op_) {
    case BenchOp::kAllreduce: return reduceAll(redop_, dtype_, size_, j);
    case BenchOp::kBroadcast: return genValue(0, j, dtype_, redop_);
    case BenchOp::kAllgather: return genValue(static_cast<int>(j / count_), j % count_, dtype_, redop_);
    case BenchOp::kAlltoall: {
      const int64_t chunk = count_ / size_;  // rank src sent me its chunk number rank_
      return genValue(static_cast<int>(j / chunk), rank_ * chunk + j % chunk, dtype_, redop_);
    }
    case BenchOp::kReducescatter: {
      ReduceOp op = redop_ == ReduceOp::kAverage ? ReduceOp::kAverage : ReduceOp::kSum;
      return reduceAll(op, dtype_, size_, rank_ * outCount_ + j);
    }
  }
  return NAN;
}

int64_t BenchCase::check() {
  fillInput();
  run(0);
  int64_t wrong = 0;
  const double relTol = dtype_ == DataType::kFloat16 ? 2e-3 : dtype_ == DataType::kBFloat16 ? 1.6e-2 : 1e-6;
  for (int64_t j = 0; j < outCount_; ++j) {
    double want = expected(j);
    // The expected value as the output dtype stores it.
    char tmp[8];
    store(tmp, dtype_, 0, want);
    double rounded = load(tmp, dtype_, 0);
    double got = load(output0(), dtype_, j);
    if (std::fabs(got - rounded) > relTol * std::max(1.0, std::fabs(rounded))) ++wrong;
  }
  return wrong;
}

}  // namespace chorus::bench
