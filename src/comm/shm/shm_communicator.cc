#include "comm/shm/shm_communicator.h"

#include <emmintrin.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <cstring>
#include <numeric>

#include "chorus/error.h"
#include "comm/shm/shared_pool.h"
#include "comm/shm/stream_copy.h"
#include "reduce/reduce.h"

namespace chorus {

namespace {
// Allreduces up to this size are reduced whole by every rank: one barrier less.
// 2 ranks, 8 B-4 KiB: 5.5-6.4 us against 5.9-11; 4 ranks on 2 cores: 34-62
// against 42-58 us (interleaved runs on a 2-core VM).
constexpr size_t kReduceAloneBytes = 16 << 10;

enum PathOp { kAllgatherOp, kBroadcastOp, kAlltoallOp };

// Picks the peer path of one large collective and reports how long it took.
struct PathTimer {
  PathTimer(PeerPathChooser& c, int op, size_t bytes, bool large)
      : chooser(c), op(op), bytes(large ? bytes : 0), viaMemory(large && c.viaMemory(op, bytes)),
        start(std::chrono::steady_clock::now()) {}
  ~PathTimer() {
    // Not after a failure: an exception unwinding through here measured nothing.
    if (bytes && std::uncaught_exceptions() == 0)
      chooser.record(op, bytes, viaMemory,
                     std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  PeerPathChooser& chooser;
  const int op;
  const size_t bytes;
  const bool viaMemory;
  const std::chrono::steady_clock::time_point start;
};

}  // namespace

// Per chunk: each rank publishes only the parts the others reduce, reduces its
// own part from its private input and the others' slots, then copies the
// others' results out. Every element is reduced by exactly one rank, in rank
// order, so every rank ends up with the same bits.
void ShmCommunicator::allreduce(void* buf, size_t count, DataType dtype, ReduceOp op) {
  allreduceSpans({Span{buf, count}}, dtype, op);
}

// Each chunk of the (virtual, concatenated) spans: every rank publishes the parts
// the others reduce, reduces its own part reading its own inputs directly, and
// copies the others' reduced parts back.
void ShmCommunicator::allreduceSpans(const std::vector<Span>& spans, DataType dtype, ReduceOp op) {
  reduceSpans(spans, dtype, op, 1.0);
}

// One rank alone copies its inputs, and the default scales them after.
void ShmCommunicator::allreduceSpansScaled(const std::vector<Span>& spans, DataType dtype, ReduceOp op,
                                           double scale) {
  if (size() == 1) return Communicator::allreduceSpansScaled(spans, dtype, op, scale);
  reduceSpans(spans, dtype, op, scale);
}

void ShmCommunicator::reduceSpans(const std::vector<Span>& spans, DataType dtype, ReduceOp op, double scale) {
  const int n = size(), me = rank();
  std::vector<size_t> start(spans.size() + 1, 0);
  for (size_t i = 0; i < spans.size(); ++i) start[i + 1] = start[i] + spans[i].count;
  const size_t count = start.back();
  const size_t es = dtypeSize(dtype);
  if (n == 1) return copySpanInputs(spans, es);
  if (count == 0) return;
  // Only tensors of kMinBytes and more can lie in the pool: the same test on every rank.
  const bool poolSized = std::all_of(spans.begin(), spans.end(), [&](const Span& s) {
    return s.count == 0 || s.count * es >= SharedPool::kMinBytes;
  });
  if (poolSized && seg_->singleCopy() && allreduceDirect(spans, start, dtype, op, scale)) return;
  // fn(output memory, input memory, virtual index, elements) over the spans covering [a, b).
  auto pieces = [&](size_t a, size_t b, auto&& fn) {
    forEachPiece(start, a, b, [&](size_t i, size_t at, size_t len) {
      fn(static_cast<char*>(spans[i].data) + at * es, static_cast<const char*>(spans[i].input()) + at * es,
         start[i] + at, len, i);
    });
  };
  inputs_.resize(n);
  if (count * es <= std::min(kReduceAloneBytes, seg_->slotBytes())) {
    // Small: every rank publishes all of its data and reduces all of it itself,
    // in rank order like the others (the same bits everywhere): one barrier
    // instead of two. This bank is written again two rounds on, after everyone
    // has passed the next round's barrier, so nobody reads it any more by then.
    const int bank = nextBank();
    char* mine = seg_->slot(bank, me);
    pieces(0, count, [&](char*, const char* in, size_t at, size_t len, size_t) {
      copyBytes(mine + at * es, in, len * es);
    });
    seg_->barrier();
    pieces(0, count, [&](char* t, const char*, size_t at, size_t len, size_t) {
      for (int j = 0; j < n; ++j) inputs_[j] = seg_->slot(bank, j) + at * es;
      reduceMany(dtype, op, t, inputs_.data(), n, len, scale);
    });
    return;
  }
  const size_t chunk = slot() / es;
  // Separate outputs are streamed at every size of this path (past
  // kReduceAloneBytes: 20-28 KiB 7-11% faster, so below kStreamUnreadBytes too).
  // An in-place output's lines come into cache as its input is read: ordinary
  // stores cost nothing more there below kStreamOutputBytes (streaming them
  // lost 6-10% when the tensor was in cache).
  const bool large = count * es >= kStreamOutputBytes;
  auto streamed = [&](const Span& s) { return large || s.input() != s.data; };
  const bool stream = std::any_of(spans.begin(), spans.end(), [&](const Span& s) { return s.count && streamed(s); });
  // Each rank's slot data starts at the line offset that its largest span's
  // input has (noted beside the slot), so that copies between buffers and slots
  // move whole lines where the ranks' buffers sit alike. Buffers 16 bytes past a
  // line boundary (as malloc's are) were 10-13% slower than line-aligned ones
  // at 64 KiB-64 MiB before (2 ranks, A/B).
  size_t big = 0;
  for (size_t i = 1; i < spans.size(); ++i)
    if (spans[i].count > spans[big].count) big = i;
  const size_t myShift = (reinterpret_cast<uintptr_t>(spans[big].input()) - start[big] * es) % 64;
  std::vector<size_t> shift(n);  // by rank, read from the notes after the first barrier
  // fn(j, a, b) for the part [a, b) of every other rank j in the round at `off`.
  auto othersParts = [&](size_t off, auto&& fn) {
    const size_t m = std::min(chunk, count - off);
    for (int j = 0; j < n; ++j) {
      if (j == me) continue;
      size_t a, b;
      splitRange(m, n, j, &a, &b);
      fn(j, off + a, off + b);
    }
  };
  // Copies the others' results of the round at `off`, in `bank`, out of their slots.
  auto copyOut = [&](size_t off, int bank) {
    othersParts(off, [&](int j, size_t a, size_t b) {
      const int h = (j + 1) % n;
      pieces(a, b, [&](char* t, const char*, size_t at, size_t len, size_t i) {
        writeOut(t, seg_->slot(bank, h) + shift[h] + (at - off) * es, len * es, streamed(spans[i]));
      });
    });
  };
  // Publishes my inputs of the round at `off` for the parts the others reduce.
  auto copyIn = [&](size_t off, int bank) {
    *seg_->slotNote(bank, me) = myShift;
    char* mine = seg_->slot(bank, me) + myShift;
    othersParts(off, [&](int, size_t a, size_t b) {
      pieces(a, b, [&](char*, const char* in, size_t at, size_t len, size_t) {
        copyBytes(mine + (at - off) * es, in, len * es);
      });
    });
  };
  // Reduces my part of the round at `off` from my inputs and the others' slots.
  auto reduceRound = [&](size_t off, int bank) {
    const size_t m = std::min(chunk, count - off);
    size_t a, b;
    splitRange(m, n, me, &a, &b);
    pieces(off + a, off + b, [&](char* t, const char* in, size_t at, size_t len, size_t i) {
      for (int j = 0; j < n; ++j) inputs_[j] = j == me ? in : seg_->slot(bank, j) + shift[j] + (at - off) * es;
      // The result goes over the next rank's published part, where the others
      // copy it from: lines this core has just read, not lines the others hold
      // from their last copy-out. 2 ranks, A/B: 64 KiB 14.7 against 19.0 us,
      // 256 KiB 60 against 77, 1 MiB 270 against 296, 64 MiB 16.9 against 17.8 ms.
      const int h = (me + 1) % n;
      char* out = seg_->slot(bank, h) + shift[h] + (at - off) * es;
      if (streamed(spans[i])) {
        void* outs[1] = {t};
        reduceManyStreamed(dtype, op, out, outs, 1, inputs_.data(), n, len, scale);
      } else {
        reduceMany(dtype, op, out, inputs_.data(), n, len, scale);
        copyBytes(t, out, len * es);
      }
    });
  };
  size_t doneOff = 0;
  int doneBank = -1;  // the round whose results are still to be copied out
  for (size_t off = 0; off < count; off += chunk) {
    // Two ranks use one bank for every round: a rank's slot is read by the peer
    // only between a round's barriers and by its owner after them, so the
    // owner copies the last round's results out and then the next inputs in
    // over the same lines, which it has just read. A/B: 2 MiB 524 against
    // 552 us, 16 MiB 3.91 against 4.18 ms, 64 MiB 17.8 against 19.1 (copying
    // out and in by turns in 4-64 KiB blocks: slower or level). With more
    // ranks the others may still be copying results out of that slot.
    const bool reuse = n == 2 && doneBank >= 0;
    const int bank = reuse ? doneBank : nextBank();
    if (reuse) {
      copyOut(doneOff, doneBank);
      doneBank = -1;
    }
    copyIn(off, bank);
    // More ranks: the previous round's results go out after this round's
    // inputs are in, 3-5% faster at 4-64 MiB than the other way round (2 ranks,
    // A/B, before the one bank above). Safe: a rank writes that bank again only
    // after the next barrier but one.
    if (doneBank >= 0) copyOut(doneOff, doneBank);
    seg_->barrier();  // every rank's parts are published
    // A rank notes the same shift in every bank it uses during the op.
    if (off == 0)
      for (int j = 0; j < n; ++j) shift[j] = j == me ? myShift : *seg_->slotNote(bank, j);
    reduceRound(off, bank);
    seg_->barrier();  // every rank's part is reduced
    doneOff = off;
    doneBank = bank;
  }
  copyOut(doneOff, doneBank);
  if (stream) _mm_sfence();  // the streamed results are visible before the op completes
}

void ShmCommunicator::allreduceBitsOr(uint64_t* words, size_t count) {
  const int n = size(), me = rank();
  if (n == 1 || count == 0) return;
  const size_t per = seg_->slotBytes() / 8;
  for (size_t off = 0; off < count; off += per) {
    const size_t m = std::min(per, count - off);
    const int bank = nextBank();
    std::memcpy(seg_->slot(bank, me), words + off, m * 8);
    seg_->barrier();
    for (int j = 0; j < n; ++j) {
      if (j == me) continue;
      const auto* theirs = reinterpret_cast<const uint64_t*>(seg_->slot(bank, j));
      for (size_t i = 0; i < m; ++i) words[off + i] |= theirs[i];
    }
  }
}

// Payloads up to the size that allreduceSpans reduces whole, after the words.
size_t ShmCommunicator::payloadCapacity(size_t words) const {
  const size_t at = (words * 8 + 63) & ~size_t{63};
  return size() > 1 && at < seg_->slotBytes() ? std::min(kReduceAloneBytes, seg_->slotBytes() - at) : 0;
}

// One round: words and payload published together, the words OR-ed. The bank is
// written again two rounds on, after everyone has passed the next round's barrier,
// so the payloads stay readable until then.
void ShmCommunicator::allreduceBitsOrWithPayload(uint64_t* words, size_t count, const void* payload, size_t bytes) {
  const int n = size(), me = rank();
  if (bytes > payloadCapacity(count)) throw Error("internal error: negotiation payload too large");
  const int bank = nextBank();
  char* mine = seg_->slot(bank, me);
  const size_t at = (count * 8 + 63) & ~size_t{63};
  std::memcpy(mine, words, count * 8);
  if (bytes) copyBytes(mine + at, static_cast<const char*>(payload), bytes);
  seg_->barrier();
  for (int j = 0; j < n; ++j) {
    if (j == me) continue;
    const auto* theirs = reinterpret_cast<const uint64_t*>(seg_->slot(bank, j));
    for (size_t i = 0; i < count; ++i) words[i] |= theirs[i];
  }
  payloadBank_ = bank;
  payloadOffset_ = at;
  payloadRound_ = round_;
}

const char* ShmCommunicator::payloadOf(int r) const {
  if (payloadRound_ != round_) throw Error("internal error: the negotiation's payload is gone");
  return seg_->slot(payloadBank_, r) + payloadOffset_;
}

void ShmCommunicator::allgatherv(const void* in, void* out, const std::vector<size_t>& bytes) {
  const int n = size(), me = rank();
  std::vector<size_t> offset(n + 1, 0);
  for (int j = 0; j < n; ++j) offset[j + 1] = offset[j] + bytes[j];
  const size_t most = *std::max_element(bytes.begin(), bytes.end());
  if (n > 1 && seg_->singleCopy() && offset[n] >= SharedPool::kMinBytes && allgatherDirect(in, out, offset)) return;
  const bool stream = offset[n] >= kStreamUnreadBytes;
  const size_t S = slot();
  char* dst = static_cast<char*>(out);
  const char* src = static_cast<const char*>(in);
  const bool inPlace = dst + offset[me] == src;
  PathTimer timer(paths_, kAllgatherOp, offset[n], offset[n] >= kStreamOutputBytes);
  // Slot data at my input's offset within a line, as in allreduceSpans: inputs
  // and outputs 16 bytes past a line were 7-10% slower than aligned ones before
  // (2 ranks, 1-64 MiB, A/B).
  const size_t myShift = reinterpret_cast<uintptr_t>(src) % 64;
  for (size_t pos = 0; pos < most; pos += S) {
    const int bank = nextBank();
    if (pos < bytes[me]) {
      const size_t len = std::min(S, bytes[me] - pos);
      *seg_->slotNote(bank, me) = myShift;
      char* slot = seg_->slot(bank, me) + myShift;
      if (inPlace) {
        writeOut(slot, src + pos, len, timer.viaMemory);
      } else if (stream) {
        streamCopy(dst + offset[me] + pos, src + pos, len, slot, timer.viaMemory);  // one read for both
      } else {
        copyBytes(slot, src + pos, len);
        copyBytes(dst + offset[me] + pos, src + pos, len);
      }
    }
    seg_->barrier();
    for (int j = 0; j < n; ++j) {
      if (j == me || pos >= bytes[j]) continue;
      const size_t len = std::min(S, bytes[j] - pos);
      writeOut(dst + offset[j] + pos, seg_->slot(bank, j) + *seg_->slotNote(bank, j), len, stream);
    }
  }
  if (stream) _mm_sfence();
}

void ShmCommunicator::broadcast(void* buf, size_t bytes, int root) {
  if (size() == 1 || bytes == 0) return;
  const bool stream = bytes >= kStreamUnreadBytes;
  // Rounds of at most an eighth of the data (down to 64 KiB): the root fills
  // the next slot while the others empty the last, instead of taking turns.
  // (Faster than the others reading the root's memory by cross-memory attach:
  // 256-512 KiB in 80-190 us against 150-400 us on a 2-core VM.)
  const size_t S = std::min(slot(), std::max<size_t>(64 << 10, (bytes / 8 + 63) & ~size_t{63}));
  char* data = static_cast<char*>(buf);
  PathTimer timer(paths_, kBroadcastOp, bytes, bytes >= kStreamOutputBytes);
  for (size_t pos = 0; pos < bytes; pos += S) {
    const size_t len = std::min(S, bytes - pos);
    const int bank = nextBank();
    if (rank() == root) writeOut(seg_->slot(bank, root), data + pos, len, timer.viaMemory);
    seg_->barrier();
    if (rank() != root) writeOut(data + pos, seg_->slot(bank, root), len, stream);
  }
  if (stream) _mm_sfence();
}

// Each slot is split into one sub-slot per destination; my piece for myself is
// copied directly.
void ShmCommunicator::alltoallv(const void* in, const std::vector<size_t>& sendBytes, void* out,
                                const std::vector<size_t>& recvBytes, size_t largestPiece) {
  const int n = size(), me = rank();
  std::vector<size_t> sendOff(n + 1, 0), recvOff(n + 1, 0);
  for (int j = 0; j < n; ++j) {
    sendOff[j + 1] = sendOff[j] + sendBytes[j];
    recvOff[j + 1] = recvOff[j] + recvBytes[j];
  }
  const char* src = static_cast<const char*>(in);
  char* dst = static_cast<char*>(out);
  const bool stream = recvOff[n] >= kStreamUnreadBytes;
  if (sendBytes[me]) writeOut(dst + recvOff[me], src + sendOff[me], sendBytes[me], stream);
  if (n == 1) return;
  const size_t sub = (slot() / n) & ~size_t{63};
  const size_t most = largestPiece;  // rounds: enough for it, the same on every rank
  PathTimer timer(paths_, kAlltoallOp, recvOff[n], recvOff[n] >= kStreamOutputBytes);
  for (size_t pos = 0; pos < most; pos += sub) {
    const int bank = nextBank();
    char* mine = seg_->slot(bank, me);
    for (int j = 0; j < n; ++j)
      if (j != me && pos < sendBytes[j])
        writeOut(mine + j * sub, src + sendOff[j] + pos, std::min(sub, sendBytes[j] - pos), timer.viaMemory);
    seg_->barrier();
    for (int j = 0; j < n; ++j)
      if (j != me && pos < recvBytes[j])
        writeOut(dst + recvOff[j] + pos, seg_->slot(bank, j) + me * sub, std::min(sub, recvBytes[j] - pos), stream);
  }
  if (stream) _mm_sfence();
}

void ShmCommunicator::reducescatter(void* buf, void* out, const std::vector<size_t>& counts, DataType dtype,
                                    ReduceOp op) {
  scatterReduced(buf, out, counts, dtype, op, 1.0);
}

void ShmCommunicator::reducescatterScaled(void* buf, void* out, const std::vector<size_t>& counts, DataType dtype,
                                          ReduceOp op, double scale) {
  if (size() == 1) return Communicator::reducescatterScaled(buf, out, counts, dtype, op, scale);
  scatterReduced(buf, out, counts, dtype, op, scale);
}

// Rank j's piece is reduced by rank j from every rank's sub-slot j.
void ShmCommunicator::scatterReduced(void* buf, void* out, const std::vector<size_t>& counts, DataType dtype,
                                     ReduceOp op, double scale) {
  const int n = size(), me = rank();
  const size_t es = dtypeSize(dtype);
  std::vector<size_t> off(n + 1, 0);
  for (int j = 0; j < n; ++j) off[j + 1] = off[j] + counts[j];
  char* data = static_cast<char*>(buf);
  if (n == 1) {
    if (counts[0]) std::memcpy(out, data, counts[0] * es);
    return;
  }
  if (off[n] * es >= SharedPool::kMinBytes && seg_->singleCopy() && reducescatterDirect(buf, out, off, dtype, op, scale))
    return;
  const size_t subElems = ((slot() / n) & ~size_t{63}) / es;
  if (subElems == 0)
    throw InvalidArgument("CHORUS_SHM_SLOT_BYTES is too small for a reducescatter of " + std::string(dtypeName(dtype)) +
                          " over " + std::to_string(n) + " ranks of one host");
  const size_t most = *std::max_element(counts.begin(), counts.end());
  const bool stream = counts[me] * es >= kStreamUnreadBytes;
  inputs_.resize(n);
  for (size_t pos = 0; pos < most; pos += subElems) {
    const int bank = nextBank();
    char* mine = seg_->slot(bank, me);
    for (int j = 0; j < n; ++j)
      if (j != me && pos < counts[j])
        copyBytes(mine + j * subElems * es, data + (off[j] + pos) * es, std::min(subElems, counts[j] - pos) * es);
    seg_->barrier();
    if (pos < counts[me]) {
      const size_t m = std::min(subElems, counts[me] - pos);
      // My own piece comes straight from my buffer; the others' from their slots.
      for (int j = 0; j < n; ++j)
        inputs_[j] = j == me ? data + (off[me] + pos) * es : seg_->slot(bank, j) + me * subElems * es;
      reduceOut(dtype, op, static_cast<char*>(out) + pos * es, inputs_.data(), n, m, stream, scale);
    }
  }
  if (stream) _mm_sfence();
}

void ShmCommunicator::barrier() {
  if (size() > 1) seg_->barrier();
}

CommTuning ShmCommunicator::tuning() const {
  CommTuning t;
  t.peerPath = static_cast<int>(paths_.forced());
  t.slotBytes = static_cast<int64_t>(slot_);
  t.maxSlotBytes = static_cast<int64_t>(seg_->slotBytes());
  return t;
}

void ShmCommunicator::setTuning(const CommTuning& t) {
  if (t.peerPath >= 0 && t.peerPath <= 2) paths_.force(static_cast<PeerPath>(t.peerPath));
  // Whole lines, at least 64 KiB (the alltoall's per-rank part must hold a line), at most the segment's.
  if (t.slotBytes > 0)
    slot_ = std::clamp<size_t>(static_cast<size_t>(t.slotBytes) & ~size_t{63},
                               std::min<size_t>(64 << 10, seg_->slotBytes()), seg_->slotBytes());
}

}  // namespace chorus
