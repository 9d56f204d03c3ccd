#include "launcher/spawn.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <string>

#include "launcher/binding.h"

extern char** environ;

namespace chorus::launcher {

namespace {

volatile sig_atomic_t gInterrupted = 0;
void onSignal(int sig) { gInterrupted = sig; }

struct Stream {
  int fd = -1;
  int rank = 0;
  bool isErr = false;
  bool open = false;    // this stream's tag starts the terminal's current line
  bool redraw = false;  // a '\r' came: the next text redraws the line, tag first
  bool cut = false;     // another stream ended this one's line: its own newline is spent
};

struct Rank {
  pid_t pid = -1;
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

std::string describe(int status) {
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

pid_t spawnRank(const LocalJob& job, int rank, int outFd, int errFd) {
  pid_t pid = fork();
  if (pid != 0) return pid;
  // Child: its own process group, so that stopping it stops what it started.
  setpgid(0, 0);
  signal(SIGINT, SIG_DFL);
  signal(SIGTERM, SIG_DFL);
  dup2(outFd, STDOUT_FILENO);
  dup2(errFd, STDERR_FILENO);
  for (const auto& [k, v] : job.rankEnv[rank]) setenv(k.c_str(), v.c_str(), 1);
  if (static_cast<size_t>(rank) < job.rankCpus.size() && !bindTo(job.rankCpus[rank]))
    std::fprintf(stderr, "chorusrun: cannot bind rank %d to its CPUs: %s; it runs unbound\n", rank, std::strerror(errno));
  std::vector<char*> argv;
  for (const auto& a : job.command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  execvp(argv[0], argv.data());
  std::fprintf(stderr, "chorusrun: cannot run '%s': %s\n", argv[0], std::strerror(errno));
  _exit(127);
}

}  // namespace

int runWithMpirun(int np, const std::string& hosts, const std::string& hostfile, const std::string& mpiArgs,
                  const std::vector<std::string>& command, bool verbose) {
  std::vector<std::string> args = {"mpirun", "-np", std::to_string(np), "--tag-output", "--bind-to", "none",
                                   "--map-by", "slot"};
  if (getuid() == 0) args.push_back("--allow-run-as-root");
  if (!hosts.empty()) args.insert(args.end(), {"-H", hosts});
  if (!hostfile.empty()) args.insert(args.end(), {"--hostfile", hostfile});
  // Pass chorus's settings and the paths the ranks need on every host.
  for (char** e = environ; *e; ++e) {
    std::string kv = *e;
    std::string key = kv.substr(0, kv.find('='));
    if (key.rfind("CHORUS_", 0) == 0 || key.rfind("HOROVOD_", 0) == 0 || key == "PATH" || key == "LD_LIBRARY_PATH" ||
        key == "PYTHONPATH")
      args.insert(args.end(), {"-x", key});
  }
  std::istringstream extra(mpiArgs);
  for (std::string a; extra >> a;) args.push_back(a);
  args.insert(args.end(), command.begin(), command.end());
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
    std::fprintf(stderr, "chorusrun: cannot run mpirun: %s (install Open MPI: openmpi-bin)\n", std::strerror(errno));
    _exit(127);
  }
  // mpirun forwards Ctrl-C to the ranks itself; chorusrun just waits.
  signal(SIGINT, SIG_IGN);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return exitCodeOf(status);
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

int runLocalJob(const LocalJob& job) {
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
    int out[2], err[2];
    if (pipe(out) != 0 || pipe(err) != 0) {
      std::perror("chorusrun: pipe");
      return 1;
    }
    ranks[r].pid = spawnRank(job, r, out[1], err[1]);
    ranks[r].running = ranks[r].pid > 0;
    setpgid(ranks[r].pid, ranks[r].pid);
    close(out[1]);
    close(err[1]);
    for (int fd : {out[0], err[0]}) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    streams.push_back({out[0], r, false});
    streams.push_back({err[0], r, true});
    if (job.verbose) std::fprintf(stderr, "chorusrun: started rank %d as pid %d\n", r, ranks[r].pid);
  }

  int result = 0;
  bool stopping = false;
  auto killAt = std::chrono::steady_clock::time_point::max();
  auto drainUntil = std::chrono::steady_clock::time_point::max();
  auto stopAll = [&](int sig) {
    for (auto& rk : ranks)
      if (rk.running) kill(-rk.pid, sig);
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
        const bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        if (failed && !stopping) {
          endOpenLine();  // chorusrun's own line starts a line of its own
          if (result == 0) result = exitCodeOf(status);
          if (job.keepGoing) {
            std::fprintf(stderr, "chorusrun: rank %d %s; the other ranks run on (--keep-going)\n", r,
                         describe(status).c_str());
          } else {
            std::fprintf(stderr, "chorusrun: rank %d %s; stopping the other ranks\n", r, describe(status).c_str());
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
  for (auto& s : streams)
    if (s.fd >= 0) close(s.fd);
  if (result != 0 && job.verbose) std::fprintf(stderr, "chorusrun: job failed with exit code %d\n", result);
  return result;
}

}  // namespace chorus::launcher
