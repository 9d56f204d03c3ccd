#include "core/coordinator.h"

#include <algorithm>
#include <sstream>

namespace chorus {

Coordinator::Coordinator(std::vector<int> globalRanks, int32_t setId)
    : globalRanks_(std::move(globalRanks)),
      setId_(setId),
      size_(static_cast<int>(globalRanks_.size())),
      joined_(size_, false) {}

bool Coordinator::anyJoined() const { return joinedCount_ > 0; }

void Coordinator::submit(int rank, const Request& req, Clock::time_point now) {
  if (req.type == OpType::kJoin) {
    if (!joined_[rank]) {
      joined_[rank] = true;
      ++joinedCount_;
      lastJoined_ = rank;
    }
    // Tensors waiting only for this rank may now be ready.
    for (const auto& name : std::vector<std::string>(arrival_)) checkReady(name);
    finishJoinIfComplete();
    submitDeferred(now);
    return;
  }
  auto it = table_.find(req.name);
  if (it == table_.end()) {
    Pending p;
    p.byRank.resize(size_);
    p.firstSeen = now - std::chrono::milliseconds(req.ageMs);
    it = table_.emplace(req.name, std::move(p)).first;
    arrival_.push_back(req.name);
  }
  Pending& p = it->second;
  if (!p.byRank[rank]) {
    p.byRank[rank] = req;
    ++p.count;
    ++version_;
  } else if (p.byRank[rank]->conflictSet >= 0 && req.conflictSet < 0) {
    // This rank's marker stands for an earlier use of the name, still waiting
    // for others; this request is the rank's next use: it joins the table once
    // the earlier entry is done.
    deferred_[req.name].emplace_back(rank, req);
    return;
  }
  checkReady(req.name);
  submitDeferred(now);
}

void Coordinator::submitDeferred(Clock::time_point now) {
  for (auto d = deferred_.begin(); d != deferred_.end();) {
    if (table_.count(d->first)) {
      ++d;
      continue;
    }
    auto later = std::move(d->second);
    deferred_.erase(d);
    for (const auto& [r, q] : later) submit(r, q, now);
    d = deferred_.begin();  // submit may have changed the map
  }
}

std::map<std::string, std::vector<int>> Coordinator::missingByName() const {
  std::map<std::string, std::vector<int>> out;
  for (const auto& [name, p] : table_) {
    auto& missing = out[name];
    for (int r = 0; r < size_; ++r)
      if (!p.byRank[r]) missing.push_back(globalRanks_[r]);
  }
  return out;
}

void Coordinator::finishJoinIfComplete() {
  if (joinedCount_ != size_) return;
  Response r;
  r.type = OpType::kJoin;
  r.name = "join";
  r.lastJoined = globalRanks_[lastJoined_];
  std::fill(joined_.begin(), joined_.end(), false);
  joinedCount_ = 0;
  lastJoined_ = -1;
  ready_.push_back(std::move(r));
}

// Joined ranks stand in for allreduce, reducescatter and alltoall: zeros in
// reductions, no rows in alltoalls. Allgather and broadcast are refused while a
// rank has joined, as Horovod refuses them; "" when the op can run.
std::string Coordinator::unjoinable(const Pending& p) const {
  for (const auto& q : p.byRank) {
    if (!q) continue;
    if (q->type == OpType::kAllgather)
      return "Allgather is not supported with Join at this time (specify sparse_to_dense=True if using "
             "DistributedOptimizer)";
    if (q->type == OpType::kBroadcast) return "Broadcast is not supported with Join at this time";
    return "";
  }
  return "";
}

void Coordinator::checkReady(const std::string& name) {
  auto it = table_.find(name);
  if (it == table_.end()) return;
  Pending& p = it->second;
  int present = 0;
  bool usesJoined = false;
  for (int r = 0; r < size_; ++r) {
    if (p.byRank[r]) {
      ++present;
    } else if (joined_[r]) {
      usesJoined = true;
    }
  }
  const int missing = size_ - present;
  if (missing > 0) {
    // Every missing rank has joined: run with stand-ins or refuse clearly.
    int joinedMissing = 0;
    for (int r = 0; r < size_; ++r)
      if (!p.byRank[r] && joined_[r]) ++joinedMissing;
    if (joinedMissing != missing) return;
    if (const std::string why = unjoinable(p); !why.empty()) {
      Response err;
      const Request& any = *std::find_if(p.byRank.begin(), p.byRank.end(),
                                         [](const auto& q) { return q.has_value(); })->operator->();
      err.type = any.type;
      err.name = name;
      err.errorKind = ErrorKind::kInvalid;
      std::vector<int> joinedRanks;
      for (int r = 0; r < size_; ++r)
        if (joined_[r]) joinedRanks.push_back(r);
      err.error = why + ": " + opTypeName(any.type) + " '" + name + "' while ranks " + ranksOf(joinedRanks) +
                  " have joined";
      err.priority = any.priority;
      const std::string group = any.group;
      const int groupSize = any.groupSize;
      table_.erase(it);
      ++version_;
      arrival_.erase(std::find(arrival_.begin(), arrival_.end(), name));
      emit(std::move(err), group, groupSize);
      return;
    }
  }
  // A rank that holds the name in flight on another set said so with a marker;
  // now that every rank has taken part, the error reaches them all.
  std::vector<int> submitted, marked;
  Response err;
  for (int r = 0; r < size_; ++r) {
    if (!p.byRank[r]) continue;
    const Request& q = *p.byRank[r];
    if (q.conflictSet >= 0) {
      marked.push_back(r);
      err.markedRanks.push_back(r);
      if (std::find(err.conflictSets.begin(), err.conflictSets.end(), q.conflictSet) == err.conflictSets.end())
        err.conflictSets.push_back(q.conflictSet);
    } else {
      submitted.push_back(r);
      err.type = q.type;
      err.priority = q.priority;
    }
  }
  if (!marked.empty()) {
    std::ostringstream sets;
    for (size_t k = 0; k < err.conflictSets.size(); ++k) sets << (k ? ", " : "") << err.conflictSets[k];
    err.name = name;
    err.errorKind = ErrorKind::kMismatch;
    err.error = std::string(opTypeName(err.type)) + " '" + name + "': ranks " + ranksOf(submitted) +
                " submitted it on process set " + std::to_string(setId_) + " but ranks " + ranksOf(marked) +
                " have it in flight on process set " + sets.str() + "; every rank must use a name on the same process set";
    std::string group;  // from a submitted request: a marker carries no group
    int groupSize = 0;
    for (const auto& q : p.byRank) {
      if (q && q->conflictSet < 0) {
        group = q->group;
        groupSize = q->groupSize;
        break;
      }
    }
    table_.erase(it);
    ++version_;
    arrival_.erase(std::find(arrival_.begin(), arrival_.end(), name));
    emit(std::move(err), group, groupSize);
    return;
  }
  Response resp = build(name, p);
  resp.involvesJoined = usesJoined;
  const Request& first = *std::find_if(p.byRank.begin(), p.byRank.end(),
                                       [](const auto& q) { return q.has_value(); })->operator->();
  std::string group = first.group;
  int groupSize = first.groupSize;
  table_.erase(it);
  ++version_;
  arrival_.erase(std::find(arrival_.begin(), arrival_.end(), name));
  emit(std::move(resp), group, groupSize);
}

void Coordinator::emit(Response resp, const std::string& group, int groupSize) {
  if (group.empty() || groupSize <= 1) {
    ready_.push_back(std::move(resp));
    return;
  }
  // A group runs once every member is answered. A member's error answers it at
  // once; the others still run together, not held for a member that never comes.
  GroupHold& g = groups_[group];
  ++g.answered;
  if (resp.errorKind != ErrorKind::kNone) {
    ready_.push_back(std::move(resp));
  } else {
    g.held.push_back(std::move(resp));
  }
  if (g.answered >= groupSize) {
    for (auto& m : g.held) ready_.push_back(std::move(m));
    groups_.erase(group);
  }
}

std::string Coordinator::ranksOf(const std::vector<int>& setRanks) const {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < setRanks.size(); ++i) os << (i ? ", " : "") << globalRanks_[setRanks[i]];
  os << "]";
  return os.str();
}

namespace {
// Groups ranks by the string form of one field; more than one group is a mismatch.
struct FieldCheck {
  std::map<std::string, std::vector<int>> values;
  void add(const std::string& v, int rank) { values[v].push_back(rank); }
  bool agrees() const { return values.size() <= 1; }
};

Shape tail(const Shape& s) { return s.empty() ? Shape{} : Shape(s.begin() + 1, s.end()); }

std::string num(double d) {
  std::ostringstream os;
  os << d;
  return os.str();
}
}  // namespace

Response Coordinator::build(const std::string& name, const Pending& p) {
  const Request* first = nullptr;
  for (const auto& q : p.byRank)
    if (q && !first) first = &*q;
  Response r;
  r.type = first->type;
  r.name = name;
  r.dtype = first->dtype;
  r.op = first->op;
  r.root = first->root;
  r.prescale = first->prescale;
  r.postscale = first->postscale;
  r.priority = first->priority;
  r.shape = first->shape;
  r.onDevice = first->device >= 0;

  // Fields that must agree, checked in order; the first disagreement is reported.
  // A field agrees where its values are equal, or else where their text is (the
  // text is made only then, and for the message: this runs for every new op).
  auto agrees = [&](const char* label, auto same, auto text) {
    bool all = true;
    for (int rk = 0; rk < size_ && all; ++rk)
      if (p.byRank[rk] && !same(*p.byRank[rk], *first)) all = text(*p.byRank[rk]) == text(*first);
    if (all) return true;
    FieldCheck c;
    for (int rk = 0; rk < size_; ++rk)
      if (p.byRank[rk]) c.add(text(*p.byRank[rk]), rk);
    std::ostringstream os;
    os << "Mismatched " << opTypeName(first->type) << " for tensor '" << name << "': " << label;
    bool firstValue = true;
    for (const auto& [value, ranks] : c.values) {
      os << (firstValue ? " " : ", ") << value << " on ranks " << ranksOf(ranks);
      firstValue = false;
    }
    r.errorKind = ErrorKind::kMismatch;
    r.error = os.str();
    return false;
  };
  auto sameShape = [](const Request& a, const Request& b) { return a.shape == b.shape; };
  auto shapeText = [](const Request& q) { return shapeString(q.shape); };
  bool ok = agrees("operation", [](const Request& a, const Request& b) { return a.type == b.type; },
                   [](const Request& q) { return std::string(opTypeName(q.type)); }) &&
            agrees("dtype", [](const Request& a, const Request& b) { return a.dtype == b.dtype; },
                   [](const Request& q) { return std::string(dtypeName(q.dtype)); }) &&
            // (CUDA ordinals may differ between ranks; host against CUDA may not)
            agrees("device", [](const Request& a, const Request& b) { return (a.device >= 0) == (b.device >= 0); },
                   [](const Request& q) { return deviceName(q.device); });
  switch (first->type) {
    case OpType::kAllreduce:
    case OpType::kReducescatter:
      ok = ok && agrees("shape", sameShape, shapeText) &&
           agrees("reduce op", [](const Request& a, const Request& b) { return a.op == b.op; },
                  [](const Request& q) { return std::string(reduceOpName(q.op)); }) &&
           agrees("prescale factor", [](const Request& a, const Request& b) { return a.prescale == b.prescale; },
                  [](const Request& q) { return num(q.prescale); }) &&
           agrees("postscale factor", [](const Request& a, const Request& b) { return a.postscale == b.postscale; },
                  [](const Request& q) { return num(q.postscale); });
      break;
    case OpType::kBroadcast:
      ok = ok && agrees("shape", sameShape, shapeText) &&
           agrees("root rank", [](const Request& a, const Request& b) { return a.root == b.root; },
                  [this](const Request& q) {
                    return std::to_string(q.root >= 0 && q.root < size_ ? globalRanks_[q.root] : q.root);
                  });
      break;
    case OpType::kAllgather:
    case OpType::kAlltoall:
      ok = ok &&
           agrees("rank (number of dimensions)",
                  [](const Request& a, const Request& b) { return a.shape.size() == b.shape.size(); },
                  [](const Request& q) { return std::to_string(q.shape.size()); }) &&
           agrees("shape after the first dimension",
                  [](const Request& a, const Request& b) {
                    return a.shape.size() == b.shape.size() &&
                           (a.shape.empty() || std::equal(a.shape.begin() + 1, a.shape.end(), b.shape.begin() + 1));
                  },
                  [](const Request& q) { return shapeString(tail(q.shape)); });
      break;
    default:
      break;
  }
  ok = ok && agrees("group",
                    [](const Request& a, const Request& b) { return a.group == b.group && a.groupSize == b.groupSize; },
                    [](const Request& q) { return q.group + "/" + std::to_string(q.groupSize); });
  if (!ok) return r;

  if (r.type == OpType::kAllgather) {
    r.rows.assign(size_, 0);
    for (int rk = 0; rk < size_; ++rk)
      if (p.byRank[rk]) r.rows[rk] = p.byRank[rk]->shape.empty() ? 1 : p.byRank[rk]->shape[0];
  } else if (r.type == OpType::kAlltoall) {
    r.splits.assign(size_, std::vector<int64_t>(size_, 0));
    for (int rk = 0; rk < size_; ++rk)
      if (p.byRank[rk]) r.splits[rk] = p.byRank[rk]->splits;
  } else if (r.type == OpType::kBroadcast && (r.root < 0 || r.root >= size_)) {
    r.errorKind = ErrorKind::kInvalid;
    r.error = "broadcast '" + name + "': root rank is not in the process set";
  }
  return r;
}

std::vector<Response> Coordinator::takeReady() {
  std::vector<Response> out;
  out.swap(ready_);
  return out;
}

std::vector<Coordinator::Stall> Coordinator::stalls(Clock::time_point now,
                                                    double olderThanSeconds) const {
  std::vector<Stall> out;
  for (const auto& name : arrival_) {
    const Pending& p = table_.at(name);
    double secs = std::chrono::duration<double>(now - p.firstSeen).count();
    if (secs < olderThanSeconds) continue;
    Stall s;
    s.name = name;
    s.seconds = secs;
    for (int r = 0; r < size_; ++r)
      if (!p.byRank[r] && !joined_[r]) s.missingRanks.push_back(globalRanks_[r]);
    out.push_back(std::move(s));
  }
  return out;
}

void Coordinator::failPending(const std::string& why) {
  for (const auto& name : arrival_) {
    const Pending& p = table_.at(name);
    std::vector<int> submitted, missing;
    Response err;
    std::string group;
    int groupSize = 0;
    for (int r = 0; r < size_; ++r) {
      if (p.byRank[r]) {
        submitted.push_back(r);
        err.type = p.byRank[r]->type;
        err.priority = p.byRank[r]->priority;
        if (p.byRank[r]->conflictSet < 0) {  // a marker carries no group
          group = p.byRank[r]->group;
          groupSize = p.byRank[r]->groupSize;
        }
      } else if (!joined_[r]) {
        missing.push_back(r);
      }
    }
    err.name = name;
    err.errorKind = ErrorKind::kStalled;
    err.error = why + ": " + opTypeName(err.type) + " '" + name + "' was submitted by ranks " + ranksOf(submitted) +
                " and never by ranks " + ranksOf(missing);
    emit(std::move(err), group, groupSize);
  }
  table_.clear();
  arrival_.clear();
  ++version_;
}

}  // namespace chorus
