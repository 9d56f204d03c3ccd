// The master weights and optimizer state over this rank's partition, wherever
// they live: in memory (the engine's memory, or offloaded host memory) or in a
// file under nvme_path, worked on a tile at a time.
#include <algorithm>
#include <cstring>
#include <vector>

#include "chorus/error.h"
#include "zero/engine.h"

namespace chorus::zero {

void Engine::requireStateInMemory(const char* what) const {
  if (swap_)
    throw InvalidArgument(std::string("ZeRO engine: offload_optimizer device nvme keeps the optimizer's state in "
                                      "files that chorus's own optimizers (Adam, AdamW, SGD, Lion, Adagrad, LAMB) "
                                      "step a tile at a time; ") +
                          what + " needs the whole state in memory: use offload_optimizer device \"cpu\"");
}

float* Engine::master() const {
  requireStateInMemory("a view of the whole master weights");
  return masterPtr();
}

float* Engine::optimizerState(int k) const {
  requireStateInMemory("a view of the whole optimizer state");
  const Buffer& b = k == 0 ? state1_ : state2_;
  return b.size() ? b.as<float>() : nullptr;
}

void Engine::forState(size_t begin, size_t end, bool write, const StateFn& fn) const {
  if (end <= begin) return;
  if (!swap_) {
    fn(begin, end - begin, masterPtr() + begin, state1_.as<float>() + begin,
       state2_.size() ? state2_.as<float>() + begin : nullptr);
    return;
  }
  const bool two = stateCount(spec_.optimizer) == 2;
  swap_->forRange(begin, end, write ? NvmeSwap::kReadWrite : NvmeSwap::kRead,
                  [&](size_t off, size_t n, char* const* a) {
                    int k = 0;
                    float* m = masterIsParams_ ? masterPtr() + off : reinterpret_cast<float*>(a[k++]);
                    float* s1 = reinterpret_cast<float*>(a[k++]);
                    float* s2 = two ? reinterpret_cast<float*>(a[k++]) : nullptr;
                    fn(off, n, m, s1, s2);
                  });
}

void Engine::forPieces(size_t off, size_t n, float* m, float* s1, float* s2, float gradScale,
                       const std::function<void(const Piece&, const RunArgs&)>& fn) {
  const size_t es = esize();
  for (const auto& p : pieces_) {
    const size_t lo = std::max(p.partOffset, off), hi = std::min(p.partOffset + p.count, off + n);
    if (lo >= hi) continue;
    const size_t u = plan_->unitOf(p.param), in = lo - plan_->units()[u].partOffset, d = lo - off;
    fn(p, RunArgs{m + d, s1 + d, s2 ? s2 + d : nullptr, gradAt(u, in),
                  masterIsParams_ || paramSwap_ ? nullptr : paramSlice(u) + in * es, spec_.dtype, hi - lo, gradScale,
                  optSteps_});
  }
}

void Engine::roundBf16(float* m, float* s1, float* s2, size_t n) {
  const DsConfig& c = spec_.config;
  if (!c.bf16 || !c.bf16MasterWeights) return;
  // Through bf16 and back: what a bf16 buffer would hold. A tile from disk is host memory.
  Memory& mem = swap_ ? *host_ : *mem_;
  std::vector<uint16_t> hostScratch;
  char* scratch;
  if (swap_) {
    hostScratch.resize(n);
    scratch = reinterpret_cast<char*>(hostScratch.data());
  } else {
    if (bf16Scratch_.size() < n * 2) bf16Scratch_ = mem_->scratch(n * 2);
    scratch = bf16Scratch_.bytes();
  }
  auto round = [&](float* p) {
    mem.fromFloat(scratch, p, DataType::kBFloat16, n);
    mem.toFloat(p, scratch, DataType::kBFloat16, n);
  };
  if (!masterIsParams_) round(m);
  if (c.bf16OptimizerStates) {
    round(s1);
    if (s2) round(s2);
  }
}

void Engine::onDisk(const std::function<void()>& pass) {
  if (!swap_) {
    pass();
    return;
  }
  std::exception_ptr error;
  try {
    pass();
  } catch (...) {
    error = std::current_exception();
  }
  // One rank's failed read or write is an error on every rank (the others would wait in its gathers).
  double failed = error ? 1.0 : 0.0;
  if (world_ > 1) sumOver(&failed, 1, spec_.processSet, name("nvme", 0));
  if (failed == 0.0) return;
  stateBroken_ = true;
  if (error) std::rethrow_exception(error);
  throw Error("ZeRO engine: the state on disk failed on " + std::to_string(static_cast<int>(failed)) +
              " other rank(s) of the set; the step did not complete");
}

void Engine::sliceWrite(size_t at, const void* src, size_t n) {
  const size_t es = esize();
  if (!paramSwap_) {
    mem_->copy(paramPart_.bytes() + at * es, src, n * es);
    return;
  }
  std::vector<char> staged;
  const char* from = static_cast<const char*>(src);
  if (mem_->onDevice(src)) {  // (a device's values come down first)
    staged.resize(n * es);
    mem_->copy(staged.data(), src, n * es);
    mem_->sync();
    from = staged.data();
  }
  paramSwap_->forRange(at, at + n, NvmeSwap::kWrite, [&](size_t off, size_t cnt, char* const* a) {
    std::memcpy(a[0], from + (off - at) * es, cnt * es);
  });
}

void Engine::sliceRead(size_t at, void* host, size_t n) const {
  const size_t es = esize();
  if (!paramSwap_) {
    mem_->copy(host, paramPart_.bytes() + at * es, n * es);
    mem_->sync();
    return;
  }
  paramSwap_->forRange(at, at + n, NvmeSwap::kRead, [&](size_t off, size_t cnt, char* const* a) {
    std::memcpy(static_cast<char*>(host) + (off - at) * es, a[0], cnt * es);
  });
}

void Engine::masterToSlices(const float* m, size_t at, size_t n) {
  std::vector<char> low(n * esize());
  host_->fromFloat(low.data(), m, spec_.dtype, n);
  sliceWrite(at, low.data(), n);
}

void Engine::paramsToMaster(float* m, const char* params, size_t n) const {
  if (!swap_ || !mem_->onDevice(params)) {
    (swap_ ? *host_ : *mem_).toFloat(m, params, spec_.dtype, n);
    return;
  }
  std::vector<char> staged(n * esize());  // (a device's parameters into a host tile)
  mem_->copy(staged.data(), params, staged.size());
  mem_->sync();
  host_->toFloat(m, staged.data(), spec_.dtype, n);
}

void Engine::masterToParams(char* params, const float* m, size_t n) const {
  if (!swap_ || !mem_->onDevice(params)) {
    (swap_ ? *host_ : *mem_).fromFloat(params, m, spec_.dtype, n);
    return;
  }
  std::vector<char> staged(n * esize());
  host_->fromFloat(staged.data(), m, spec_.dtype, n);
  mem_->copy(params, staged.data(), staged.size());
  mem_->sync();
}

void Engine::addReduced(size_t u, const void* reduced, size_t n) {
  if (!gradSwap_) {
    mem_->accumulate(spec_.dtype, gradSlice(u), reduced, n);
    return;
  }
  const size_t es = esize(), at = plan_->units()[u].partOffset;
  const bool fresh = gradFresh_[u];
  gradFresh_[u] = false;
  if (!gradError_.empty()) return;  // (the step fails anyway)
  try {
    gradSwap_->forRange(at, at + n, fresh ? NvmeSwap::kWrite : NvmeSwap::kReadWrite,
                        [&](size_t off, size_t cnt, char* const* a) {
                          const char* src = static_cast<const char*>(reduced) + (off - at) * es;
                          if (fresh)
                            std::memcpy(a[0], src, cnt * es);
                          else
                            mem_->accumulate(spec_.dtype, a[0], src, cnt);
                        });
  } catch (const std::exception& e) {
    // Kept for the step: raised here, this rank would leave the others waiting in the backward's
    // reductions; at the norm every rank learns of it.
    gradError_ = e.what();
  }
}

const char* Engine::gradAt(size_t u, size_t in) const {
  if (!gradSwap_) return gradSlice(u) + in * esize();
  return gradTile_ + (plan_->units()[u].partOffset + in - gradTileAt_) * esize();
}

void Engine::withGradTile(size_t off, size_t n, const std::function<void()>& fn) {
  if (!gradSwap_) {
    fn();
    return;
  }
  gradSwap_->forRange(off, off + n, NvmeSwap::kRead, [&](size_t at, size_t cnt, char* const* a) {
    if (at != off || cnt != n) throw Error("ZeRO engine: a tile of gradients on disk came in pieces");
    gradTile_ = a[0];
    gradTileAt_ = off;
    fn();
  });
  gradTile_ = nullptr;
}

void Engine::writeFreshGrads() {
  if (!gradSwap_) return;
  if (!gradError_.empty()) throw Error(gradError_);
  for (size_t u = 0; u < gradFresh_.size(); ++u) {
    if (!gradFresh_[u]) continue;
    const size_t at = plan_->units()[u].partOffset;
    gradSwap_->forRange(at, at + plan_->units()[u].slice, NvmeSwap::kWrite,
                        [&](size_t, size_t cnt, char* const* a) { std::memset(a[0], 0, cnt * esize()); });
    gradFresh_[u] = false;
  }
}

double Engine::diskSumSquares() {
  writeFreshGrads();
  // The sums as localSumSquares takes them from memory (each unit's slice, or each weighted piece),
  // over the same blocks from each one's start: the same norm to the last bit on one thread.
  struct Segment {
    size_t at, count;
    double weight;
  };
  std::vector<Segment> segs;
  if (spec_.normWeights.empty())
    for (const Unit& u : plan_->units()) segs.push_back({u.partOffset, u.slice, 1.0});
  else
    for (const auto& p : pieces_) segs.push_back({p.partOffset, p.count, spec_.normWeights[p.param]});
  std::sort(segs.begin(), segs.end(), [](const Segment& a, const Segment& b) { return a.at < b.at; });
  constexpr size_t kBlock = 65536;  // (chorus::sumSquares' block)
  const size_t es = esize();
  std::vector<char> block(kBlock * es);
  size_t seg = 0, filled = 0;  // the segment being summed; its elements staged in `block`
  double sumsq = 0.0, segSum = 0.0;
  gradSwap_->forRange(0, plan_->partitionElems(), NvmeSwap::kRead, [&](size_t off, size_t n, char* const* a) {
    size_t at = off;
    while (at < off + n && seg < segs.size()) {
      const Segment& s = segs[seg];
      if (at < s.at) {  // (padding between segments)
        at = std::min(off + n, s.at);
        continue;
      }
      const size_t done = at - s.at;  // of the segment, summed or staged
      const size_t take = std::min({off + n - at, s.count - done, kBlock - filled});
      std::memcpy(block.data() + filled * es, a[0] + (at - off) * es, take * es);
      filled += take;
      at += take;
      if (filled == kBlock || done + take == s.count) {
        segSum += mem_->sumSquares(block.data(), spec_.dtype, filled);
        filled = 0;
      }
      if (done + take == s.count) {
        sumsq += s.weight * segSum;
        segSum = 0.0;
        ++seg;
      }
    }
  });
  return sumsq;
}

}  // namespace chorus::zero
