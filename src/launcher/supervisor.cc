#include "launcher/supervisor.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <stdexcept>

#include "launcher/binding.h"
#include "launcher/spawn.h"

namespace chorus::launcher {

namespace {
using Clock = std::chrono::steady_clock;
volatile sig_atomic_t gStop = 0;
void onStop(int sig) { gStop = sig; }

pid_t spawn(const RankSpec& spec, int inFd, int outFd, int errFd) {
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid != 0) return pid;
  // Child: its own process group, so that stopping it stops what it started.
  setpgid(0, 0);
  stopWithParent(parent);
  ::signal(SIGINT, SIG_DFL);
  ::signal(SIGTERM, SIG_DFL);
  ::signal(SIGPIPE, SIG_DFL);
  if (inFd >= 0) dup2(inFd, STDIN_FILENO);
  dup2(outFd, STDOUT_FILENO);
  dup2(errFd, STDERR_FILENO);
  for (const auto& [k, v] : spec.env) setenv(k.c_str(), v.c_str(), 1);
  redirectToRankLog();
  if (!bindTo(spec.cpus))
    std::fprintf(stderr, "chorusrun: cannot bind rank %d to its CPUs: %s; it runs unbound\n", spec.tag,
                 std::strerror(errno));
  std::vector<char*> argv;
  for (const auto& a : spec.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  execvp(argv[0], argv.data());
  std::fprintf(stderr, "chorusrun: cannot run '%s': %s\n", argv[0], std::strerror(errno));
  _exit(127);
}
}  // namespace

void installStopHandlers() {
  struct sigaction sa {};
  sa.sa_handler = onStop;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
}

int stopSignal() { return gStop; }

std::string describe(int status, const std::string& host) {
  if (!host.empty() && WIFEXITED(status)) {
    const int code = WEXITSTATUS(status);
    const std::string on = " on host " + host;
    if (code == 255) return "lost its ssh connection to host " + host + " (ssh exited with 255)";
    if (code > 128 && code < 128 + 65)
      return "was killed by signal " + std::to_string(code - 128) + " (" + strsignal(code - 128) + ")" + on;
    return "exited with code " + std::to_string(code) + on;
  }
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    return "was killed by signal " + std::to_string(sig) + " (" + strsignal(sig) + ")";
  }
  return "ended with status " + std::to_string(status);
}

int exitCodeOf(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

Supervisor::Supervisor(std::string outputDir, int logWidth, bool verbose)
    : outputDir_(std::move(outputDir)), logWidth_(logWidth), verbose_(verbose) {}

Supervisor::~Supervisor() {
  for (Stream* s : streams_) {
    forgetStream(*s);
    if (s->fd >= 0) close(s->fd);
    if (s->log) std::fclose(s->log);
    delete s;
  }
  for (auto& p : procs_) closeInput(p);
}

int Supervisor::start(const RankSpec& spec) {
  // Close-on-exec everywhere: a rank must not hold another's pipes (an input
  // held open elsewhere would never end, and its remote rank never stop).
  int out[2], err[2], in[2] = {-1, -1};
  if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0 || (!spec.input.empty() && pipe2(in, O_CLOEXEC) != 0))
    throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
  Proc p;
  p.spec = spec;
  p.pid = spawn(spec, in[0], out[1], err[1]);
  p.running = p.pid > 0;
  setpgid(p.pid, p.pid);
  close(out[1]);
  close(err[1]);
  if (in[0] >= 0) {
    close(in[0]);
    if (::write(in[1], spec.input.data(), spec.input.size()) != static_cast<ssize_t>(spec.input.size()))
      std::fprintf(stderr, "chorusrun: could not hand rank %d its environment\n", spec.tag);
    p.input = in[1];
    fcntl(p.input, F_SETFL, fcntl(p.input, F_GETFL) | O_NONBLOCK);  // a stalled ssh must not block us
  }
  for (int fd : {out[0], err[0]}) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  streams_.push_back(new Stream{out[0], openLog(outputDir_, spec.tag, logWidth_, "stdout"), spec.tag, false});
  streams_.push_back(new Stream{err[0], openLog(outputDir_, spec.tag, logWidth_, "stderr"), spec.tag, true});
  if (verbose_) std::fprintf(stderr, "chorusrun: started rank %d as pid %d\n", spec.tag, p.pid);
  procs_.push_back(std::move(p));
  return static_cast<int>(procs_.size()) - 1;
}

std::vector<Ended> Supervisor::poll(int timeoutMs) {
  std::vector<pollfd> fds;
  for (Stream* s : streams_)
    if (s->fd >= 0) fds.push_back({s->fd, POLLIN, 0});
  if (fds.empty()) {
    usleep(static_cast<useconds_t>(timeoutMs) * 1000);
  } else {
    ::poll(fds.data(), fds.size(), timeoutMs);
  }
  for (Stream* s : streams_) {
    if (s->fd >= 0 && !pump(*s)) {
      close(s->fd);
      s->fd = -1;
    }
  }
  // A heartbeat to every remote agent: one that hears nothing for a while takes
  // the launcher (or the link to it) for gone and stops its rank.
  if (Clock::now() - lastBeat_ > std::chrono::seconds(1)) {
    lastBeat_ = Clock::now();
    for (auto& p : procs_)
      if (p.input >= 0 && ::write(p.input, "\n", 1) < 0 && errno != EAGAIN) closeInput(p);
  }
  std::vector<Ended> ended;
  for (size_t i = 0; i < procs_.size(); ++i) {
    Proc& p = procs_[i];
    int status = 0;
    if (!p.running || waitpid(p.pid, &status, WNOHANG) != p.pid) continue;
    p.running = false;
    closeInput(p);
    ended.push_back({static_cast<int>(i), status});
  }
  return ended;
}

void Supervisor::closeInput(Proc& p) {
  if (p.input >= 0) close(p.input);
  p.input = -1;
}

void Supervisor::signal(int index, int sig) {
  Proc& p = procs_[index];
  closeInput(p);  // a remote rank's agent stops it when its input ends
  if (p.running) kill(-p.pid, sig);
}

void Supervisor::signalAll(int sig) {
  for (size_t i = 0; i < procs_.size(); ++i) signal(static_cast<int>(i), sig);
}

bool Supervisor::isRunning(int index) const { return procs_.at(static_cast<size_t>(index)).running; }

int Supervisor::running() const {
  int n = 0;
  for (const auto& p : procs_) n += p.running;
  return n;
}

bool Supervisor::outputOpen() const {
  for (const Stream* s : streams_)
    if (s->fd >= 0) return true;
  return false;
}

}  // namespace chorus::launcher
