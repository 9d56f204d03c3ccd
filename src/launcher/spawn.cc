#include "launcher/spawn.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <stdexcept>
#include <string>

#include "launcher/binding.h"

extern char** environ;

namespace chorus::launcher {

namespace {

volatile sig_atomic_t gInterrupted = 0;
void onSignal(int sig) { gInterrupted = sig; }

struct Stream {
  int fd = -1;
  FILE* log = nullptr;  // --output-filename's file for this stream
  int rank = 0;
  bool isErr = false;
  bool open = false;    // this stream's tag starts the terminal's current line
  bool redraw = false;  // a '\r' came: the next text redraws the line, tag first
  bool cut = false;     // another stream ended this one's line: its own newline is spent
};

struct Rank {
  pid_t pid = -1;
  int input = -1;  // write end of its standard input, when the job gives it one
  bool running = false;
  int status = 0;
};

// Output is passed on as it arrives, each terminal line starting with its rank's
// tag: a line redrawn after '\r' (a progress bar) gets one tag per redraw, and a
// line left open by one stream is ended before another stream writes.
Stream* gOpenLine = nullptr;

FILE* fileOf(const Stream& s) { return s.isErr ? stderr : stdout; }

void endOpenLine() {
  if (!gOpenLine) return;
  std::fputc('\n', fileOf(*gOpenLine));
  std::fflush(fileOf(*gOpenLine));
  gOpenLine->open = false;
  gOpenLine->cut = true;
  gOpenLine = nullptr;
}

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

// Reads what is available; returns false at end of file.
bool pump(Stream& s) {
  char buf[65536];
  ssize_t n = ::read(s.fd, buf, sizeof(buf));
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return true;
  if (n > 0 && s.log) {
    std::fwrite(buf, 1, static_cast<size_t>(n), s.log);
    std::fflush(s.log);
  }
  if (n <= 0) {
    if (s.open && gOpenLine == &s) endOpenLine();
    s.open = s.redraw = false;
    return false;
  }
  size_t at = 0;
  const size_t len = static_cast<size_t>(n);
  while (at < len) {
    size_t end = at;
    while (end < len && buf[end] != '\n' && buf[end] != '\r') ++end;
    if (end < len && buf[end] == '\n') {
      emit(s, buf + at, end - at, true);
    } else if (end > at) {
      emit(s, buf + at, end - at, false);
    }
    if (end < len && buf[end] == '\r') s.redraw = true;
    at = end + 1;
  }
  return true;
}

// A remote rank's status is its agent's, through ssh: 128 + N for signal N, 255
// when ssh itself failed.
std::string describe(int status, const std::string& host) {
  if (!host.empty() && WIFEXITED(status)) {
    const int code = WEXITSTATUS(status);
    const std::string on = " on host " + host;
    if (code == 255) return "lost its ssh connection to host " + host + " (ssh exited with 255)";
    if (code > 128 && code < 128 + 65) return "was killed by signal " + std::to_string(code - 128) + " (" + strsignal(code - 128) + ")" + on;
    return "exited with code " + std::to_string(code) + on;
  }
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    return "was killed by signal " + std::to_string(sig) + " (" + strsignal(sig) + ")";
  }
  return "ended with status " + std::to_string(status);
}

int exitCodeOf(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

pid_t spawnRank(const Job& job, int rank, int inFd, int outFd, int errFd) {
  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid != 0) return pid;
  // Child: its own process group, so that stopping it stops what it started.
  setpgid(0, 0);
  stopWithParent(parent);
  signal(SIGINT, SIG_DFL);
  signal(SIGTERM, SIG_DFL);
  if (inFd >= 0) dup2(inFd, STDIN_FILENO);
  dup2(outFd, STDOUT_FILENO);
  dup2(errFd, STDERR_FILENO);
  for (const auto& [k, v] : job.rankEnv[rank]) setenv(k.c_str(), v.c_str(), 1);
  if (static_cast<size_t>(rank) < job.rankCpus.size() && !bindTo(job.rankCpus[rank]))
    std::fprintf(stderr, "chorusrun: cannot bind rank %d to its CPUs: %s; it runs unbound\n", rank, std::strerror(errno));
  const auto& command = static_cast<size_t>(rank) < job.rankArgv.size() && !job.rankArgv[rank].empty()
                            ? job.rankArgv[rank]
                            : job.command;
  std::vector<char*> argv;
  for (const auto& a : command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  execvp(argv[0], argv.data());
  std::fprintf(stderr, "chorusrun: cannot run '%s': %s\n", argv[0], std::strerror(errno));
  _exit(127);
}

template <typename T>
const T& at(const std::vector<T>& v, int i) {
  static const T none{};
  return static_cast<size_t>(i) < v.size() ? v[i] : none;
}

FILE* openLog(const std::string& dir, int rank, int np, const char* name) {
  if (dir.empty()) return nullptr;
  std::string digits = std::to_string(rank);
  digits.insert(0, std::to_string(np - 1).size() - digits.size(), '0');
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

}  // namespace

int runForeground(const std::vector<std::string>& args, bool verbose) {
  if (verbose) {
    std::string line = "chorusrun: running";
    for (const auto& a : args) line += " " + a;
    std::fprintf(stderr, "%s\n", line.c_str());
  }
  pid_t pid = fork();
  if (pid == 0) {
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execvp(argv[0], argv.data());
    std::fprintf(stderr, "chorusrun: cannot run %s: %s (install Open MPI: openmpi-bin)\n", argv[0], std::strerror(errno));
    _exit(127);
  }
  // mpirun forwards Ctrl-C to the ranks itself; chorusrun just waits.
  signal(SIGINT, SIG_IGN);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return exitCodeOf(status);
}

void stopWithParent(pid_t parent) {
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (getppid() != parent) _exit(1);
}

int removeJobSegments(const std::string& jobId) {
  const std::string prefix = "chorus-" + jobId + "-";
  int removed = 0;
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d)) {
      std::string path = "/";
      path.append(e->d_name);
      if (std::strncmp(e->d_name, prefix.c_str(), prefix.size()) == 0 && shm_unlink(path.c_str()) == 0) ++removed;
    }
    closedir(d);
  }
  return removed;
}

int runJob(const Job& job) {
  const int np = static_cast<int>(job.rankEnv.size());
  struct sigaction sa {};
  sa.sa_handler = onSignal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);

  std::vector<Rank> ranks(np);
  std::vector<Stream> streams;
  streams.reserve(2 * static_cast<size_t>(np));  // gOpenLine points into it
  for (int r = 0; r < np; ++r) {
    // Close-on-exec everywhere: a rank must not hold another's pipes (an input
    // held open elsewhere would never end, and its remote rank never stop).
    int out[2], err[2], in[2] = {-1, -1};
    const std::string& input = at(job.rankInput, r);
    if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0 || (!input.empty() && pipe2(in, O_CLOEXEC) != 0)) {
      std::perror("chorusrun: pipe");
      return 1;
    }
    ranks[r].pid = spawnRank(job, r, in[0], out[1], err[1]);
    ranks[r].running = ranks[r].pid > 0;
    setpgid(ranks[r].pid, ranks[r].pid);
    close(out[1]);
    close(err[1]);
    if (in[0] >= 0) {
      close(in[0]);
      if (::write(in[1], input.data(), input.size()) != static_cast<ssize_t>(input.size()))
        std::fprintf(stderr, "chorusrun: could not hand rank %d its environment\n", r);
      ranks[r].input = in[1];
    }
    for (int fd : {out[0], err[0]}) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    streams.push_back({out[0], openLog(job.outputDir, r, np, "stdout"), r, false});
    streams.push_back({err[0], openLog(job.outputDir, r, np, "stderr"), r, true});
    if (job.verbose) std::fprintf(stderr, "chorusrun: started rank %d as pid %d\n", r, ranks[r].pid);
  }

  int result = 0;
  bool stopping = false;
  auto killAt = std::chrono::steady_clock::time_point::max();
  auto drainUntil = std::chrono::steady_clock::time_point::max();
  auto stopAll = [&](int sig) {
    for (auto& rk : ranks) {
      if (rk.input >= 0) {  // a remote rank's agent stops it when its input ends
        close(rk.input);
        rk.input = -1;
      }
      if (rk.running) kill(-rk.pid, sig);
    }
  };

  while (true) {
    std::vector<pollfd> fds;
    for (auto& s : streams)
      if (s.fd >= 0) fds.push_back({s.fd, POLLIN, 0});
    int running = 0;
    for (auto& rk : ranks) running += rk.running;
    if (fds.empty() && running == 0) break;
    if (running == 0 && drainUntil == std::chrono::steady_clock::time_point::max())
      drainUntil = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    if (std::chrono::steady_clock::now() > drainUntil) break;  // a grandchild holds a pipe open

    ::poll(fds.data(), fds.size(), 50);
    for (auto& s : streams) {
      if (s.fd < 0) continue;
      if (!pump(s)) {
        close(s.fd);
        s.fd = -1;
      }
    }

    int status;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
      for (int r = 0; r < np; ++r) {
        if (ranks[r].pid != pid) continue;
        ranks[r].running = false;
        ranks[r].status = status;
        if (ranks[r].input >= 0) {
          close(ranks[r].input);
          ranks[r].input = -1;
        }
        const bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        if (failed && !stopping) {
          endOpenLine();  // chorusrun's own line starts a line of its own
          if (result == 0) result = exitCodeOf(status);
          if (job.keepGoing) {
            std::fprintf(stderr, "chorusrun: rank %d %s; the other ranks run on (--keep-going)\n", r,
                         describe(status, at(job.rankHost, r)).c_str());
          } else {
            std::fprintf(stderr, "chorusrun: rank %d %s; stopping the other ranks\n", r,
                         describe(status, at(job.rankHost, r)).c_str());
            stopping = true;
            stopAll(SIGTERM);
            killAt = std::chrono::steady_clock::now() +
                     std::chrono::milliseconds(static_cast<int64_t>(job.killGraceSeconds * 1000));
          }
        }
      }
    }
    if (gInterrupted && !stopping) {
      endOpenLine();
      std::fprintf(stderr, "chorusrun: interrupted (signal %d); stopping every rank\n", static_cast<int>(gInterrupted));
      stopping = true;
      result = 128 + gInterrupted;
      stopAll(SIGTERM);
      killAt = std::chrono::steady_clock::now() +
               std::chrono::milliseconds(static_cast<int64_t>(job.killGraceSeconds * 1000));
    }
    if (stopping && std::chrono::steady_clock::now() > killAt) {
      stopAll(SIGKILL);
      killAt = std::chrono::steady_clock::time_point::max();
    }
  }
  endOpenLine();
  for (auto& s : streams) {
    if (s.fd >= 0) close(s.fd);
    if (s.log) std::fclose(s.log);
  }
  for (auto& rk : ranks)
    if (rk.input >= 0) close(rk.input);
  if (result != 0 && job.verbose) std::fprintf(stderr, "chorusrun: job failed with exit code %d\n", result);
  return result;
}

}  // namespace chorus::launcher
