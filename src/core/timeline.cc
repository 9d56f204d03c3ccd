#include "core/timeline.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "chorus/error.h"
#include "base/sync_dir.h"

namespace chorus {

const char* timelineOpName(OpType type) {
  switch (type) {
    case OpType::kAllreduce: return "ALLREDUCE";
    case OpType::kAllgather: return "ALLGATHER";
    case OpType::kBroadcast: return "BROADCAST";
    case OpType::kAlltoall: return "ALLTOALL";
    case OpType::kReducescatter: return "REDUCESCATTER";
    case OpType::kBarrier: return "BARRIER";
    case OpType::kJoin: return "JOIN";
  }
  return "UNKNOWN";
}

Timeline::~Timeline() {
  try {
    stop();
  } catch (...) {
    // A destructor cannot report it; stop() called explicitly does.
  }
}

void Timeline::start(const std::string& path, bool markCycles) {
  std::lock_guard<std::mutex> lock(mu_);
  if (active_) throw InvalidArgument("timeline: already writing " + path_ + "; stop it before starting another");
  if (path.empty()) throw InvalidArgument("timeline: empty file name");
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (!f) throw InvalidArgument("timeline: cannot write " + path + ": " + std::strerror(errno));
  file_ = f;
  active_ = true;
  stopping_ = false;
  path_ = path;
  markCycles_ = markCycles;
  start_ = std::chrono::steady_clock::now();
  pids_.clear();
  negotiating_.clear();
  queued_.clear();
  pending_.clear();
  first_ = true;
  const int64_t epochMicros =
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  write(nlohmann::json{{"name", "process_name"}, {"ph", "M"}, {"pid", 0},
                       {"args", {{"name", "chorus"}, {"start_time_since_epoch_in_micros", epochMicros}}}}
            .dump());
  std::string head = "[\n" + pending_;  // on disk from the start, already a valid array
  pending_.clear();
  writeChunk(head);
  flusher_ = std::thread([this] { flushLoop(); });
}

bool Timeline::writeChunk(const std::string& chunk) {
  // "\n]" closes the array; the next chunk starts with ",\n", the same two bytes' place.
  const bool ok = std::fwrite(chunk.data(), 1, chunk.size(), file_) == chunk.size() &&
                  std::fputs("\n]", file_) >= 0 && std::fflush(file_) == 0;
  std::fseek(file_, -2, SEEK_CUR);
  return ok;
}

// Readers (a viewer, tail -f, a killed job's post-mortem) see events within 50 ms;
// the data path only appends to pending_ (no file I/O under its lock).
void Timeline::flushLoop() {
  std::string chunk;
  while (true) {
    bool last;
    {
      std::unique_lock<std::mutex> lock(mu_);
      flushCv_.wait_for(lock, std::chrono::milliseconds(50), [this] { return stopping_; });
      chunk.swap(pending_);
      last = stopping_;
    }
    if (!chunk.empty()) writeChunk(chunk);
    chunk.clear();
    if (last) return;
  }
}

void Timeline::stop() {
  std::thread flusher;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!active_) return;
    active_ = false;  // events from here on are dropped
    stopping_ = true;
    flusher = std::move(flusher_);
  }
  flushCv_.notify_all();
  if (flusher.joinable()) flusher.join();  // it wrote everything queued before stopping_
  std::FILE* f = file_;
  file_ = nullptr;
  // The closing bracket is there already; a newline after it, then synced.
  const bool written = std::fseek(f, 0, SEEK_END) == 0 && std::fputs("\n", f) >= 0 && std::fflush(f) == 0 &&
                       ::fsync(fileno(f)) == 0;
  const std::string why = std::strerror(errno);
  const bool closed = std::fclose(f) == 0;
  if (!written || !closed) throw Error("timeline: cannot complete " + path_ + ": " + why);
  syncParentDir(path_);
}

int64_t Timeline::micros() const {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - start_).count();
}

void Timeline::write(const std::string& event) {
  if (!first_) pending_ += ",\n";
  first_ = false;
  pending_ += event;
}

// Each tensor name gets its own trace process, named once.
int Timeline::pidOf(const std::string& name) {
  auto it = pids_.find(name);
  if (it != pids_.end()) return it->second;
  const int pid = static_cast<int>(pids_.size()) + 1;
  pids_.emplace(name, pid);
  write(nlohmann::json{{"name", "process_name"}, {"ph", "M"}, {"pid", pid}, {"args", {{"name", name}}}}.dump());
  write(nlohmann::json{{"name", "process_sort_index"}, {"ph", "M"}, {"pid", pid}, {"args", {{"sort_index", pid}}}}
            .dump());
  return pid;
}

void Timeline::negotiateStart(const std::string& name, OpType type) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!active_ || !negotiating_.insert(name).second) return;
  const std::string phase = std::string("NEGOTIATE_") + timelineOpName(type);
  write(nlohmann::json{{"ph", "B"}, {"name", phase}, {"ts", micros()}, {"pid", pidOf(name)}}.dump());
}

void Timeline::rankReady(const std::string& name, int rank) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!active_ || !negotiating_.count(name)) return;
  write(nlohmann::json{{"ph", "X"}, {"name", std::to_string(rank)}, {"ts", micros()}, {"pid", pidOf(name)},
                       {"dur", 0}}
            .dump());
}

void Timeline::negotiateEnd(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!active_ || negotiating_.erase(name) == 0) return;
  const int64_t now = micros();
  const int pid = pidOf(name);
  write(nlohmann::json{{"ph", "E"}, {"ts", now}, {"pid", pid}}.dump());
  // Agreed everywhere; until its collective starts it waits behind other work.
  write(nlohmann::json{{"ph", "B"}, {"name", "QUEUE"}, {"ts", now}, {"pid", pid}}.dump());
  queued_.insert(name);
}

void Timeline::opStart(const std::string& name, OpType type, const OpSpanArgs& a) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!active_) return;
  const int64_t now = micros();
  const int pid = pidOf(name);
  if (queued_.erase(name)) write(nlohmann::json{{"ph", "E"}, {"ts", now}, {"pid", pid}}.dump());
  nlohmann::json args{{"bytes", a.bytes},         {"dtype", dtypeName(a.dtype)}, {"priority", a.priority},
                      {"process_set", a.processSet}, {"transport", a.transport},    {"fused_tensors", a.fused}};
  write(nlohmann::json{{"ph", "B"}, {"name", std::string(a.transport) + "_" + timelineOpName(type)}, {"ts", now},
                       {"pid", pid}, {"args", std::move(args)}}
            .dump());
}

void Timeline::opEnd(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!active_) return;
  write(nlohmann::json{{"ph", "E"}, {"ts", micros()}, {"pid", pidOf(name)}}.dump());
}

void Timeline::activityStart(const std::string& name, const char* activity) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!active_) return;
  write(nlohmann::json{{"ph", "B"}, {"name", activity}, {"ts", micros()}, {"pid", pidOf(name)}}.dump());
}

void Timeline::activityEnd(const std::string& name) { opEnd(name); }

void Timeline::cycleStart() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!active_ || !markCycles_) return;
  write(nlohmann::json{{"ph", "i"}, {"name", "CYCLE_START"}, {"ts", micros()}, {"pid", 0}, {"s", "g"}}.dump());
}

}  // namespace chorus
