#include "launcher/output.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace chorus::launcher {

namespace {
Stream* gOpenLine = nullptr;

FILE* fileOf(const Stream& s) { return s.isErr ? stderr : stdout; }

}  // namespace

void endOpenLine() {
  if (!gOpenLine) return;
  std::fputc('\n', fileOf(*gOpenLine));
  std::fflush(fileOf(*gOpenLine));
  gOpenLine->open = false;
  gOpenLine->cut = true;
  gOpenLine = nullptr;
}

namespace {
void emit(Stream& s, const char* text, size_t n, bool newline) {
  const bool cut = s.cut;
  s.cut = false;
  if (cut && newline && n == 0) return;  // the line it ends was ended for it
  if (gOpenLine && gOpenLine != &s) endOpenLine();
  std::string out;
  if (s.redraw) {
    out.push_back('\r');
    s.open = false;
    s.redraw = false;
  }
  if (!s.open) out.append("[").append(std::to_string(s.rank)).append(s.isErr ? "]<stderr>:" : "]<stdout>:");
  out.append(text, n);
  if (newline) out.push_back('\n');
  std::fwrite(out.data(), 1, out.size(), fileOf(s));
  std::fflush(fileOf(s));
  s.open = !newline;
  gOpenLine = newline ? nullptr : &s;
}

}  // namespace

namespace {
constexpr auto kHoldPartial = std::chrono::milliseconds(150);

void flushPending(Stream& s) {
  if (s.pending.empty()) return;
  emit(s, s.pending.data(), s.pending.size(), false);
  s.pending.clear();
}
}  // namespace

bool pump(Stream& s) {
  char buf[65536];
  ssize_t n = ::read(s.fd, buf, sizeof(buf));
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
    if (!s.pending.empty() && std::chrono::steady_clock::now() - s.pendingSince > kHoldPartial) flushPending(s);
    return true;
  }
  if (n > 0 && s.log) {
    std::fwrite(buf, 1, static_cast<size_t>(n), s.log);
    std::fflush(s.log);
  }
  if (n <= 0) {
    flushPending(s);
    if (s.open && gOpenLine == &s) endOpenLine();
    s.open = s.redraw = false;
    return false;
  }
  size_t at = 0;
  const size_t len = static_cast<size_t>(n);
  while (at < len) {
    size_t end = at;
    while (end < len && buf[end] != '\n' && buf[end] != '\r') ++end;
    if (end == len) {  // no end of line yet: hold it
      if (s.pending.empty()) s.pendingSince = std::chrono::steady_clock::now();
      s.pending.append(buf + at, end - at);
      // A line that never ends must not grow chorusrun: past the bound it goes
      // out as it is, open, and its continuation follows under the same tag.
      if (s.pending.size() >= kMaxPending) flushPending(s);
      break;
    }
    s.pending.append(buf + at, end - at);
    if (buf[end] == '\n') {
      emit(s, s.pending.data(), s.pending.size(), true);
      s.pending.clear();
    } else {  // '\r': a progress bar redraws its line; show it as it is now
      flushPending(s);
      s.redraw = true;
    }
    at = end + 1;
  }
  return true;
}

void forgetStream(const Stream& s) {
  if (gOpenLine == &s) gOpenLine = nullptr;
}

FILE* openLog(const std::string& dir, int rank, int width, const char* name) {
  if (dir.empty()) return nullptr;
  std::string digits = std::to_string(rank);
  digits.insert(0, std::to_string(width - 1).size() - digits.size(), '0');
  const std::string rankDir = dir + "/rank." + digits;
  std::string made;
  for (size_t at = 0; at != std::string::npos;) {  // mkdir -p
    at = rankDir.find('/', at + 1);
    made = rankDir.substr(0, at);
    if (!made.empty()) mkdir(made.c_str(), 0755);
  }
  FILE* f = std::fopen((rankDir + "/" + name).c_str(), "w");
  if (!f) throw std::runtime_error("--output-filename: cannot write " + rankDir + "/" + name + ": " + std::strerror(errno));
  return f;
}

}  // namespace chorus::launcher
