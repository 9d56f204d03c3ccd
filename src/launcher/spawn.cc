#include "launcher/spawn.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <map>
#include <string>
#include <vector>

#include "base/wire.h"
#include "chorus/settings.h"

namespace chorus::launcher {

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

void redirectToRankLog() {
  std::string path;
  if (!readSetting("CHORUS_RANK_LOG_FILE", &path) || path.empty()) return;
  unsetenv("CHORUS_RANK_LOG_FILE");
  // mkdir -p of the folder
  for (size_t at = path.find('/', 1); at != std::string::npos; at = path.find('/', at + 1))
    mkdir(path.substr(0, at).c_str(), 0755);
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    std::fprintf(stderr, "chorusrun: cannot write the rank's log %s: %s\n", path.c_str(), std::strerror(errno));
    _exit(126);
  }
  dup2(fd, STDOUT_FILENO);
  dup2(fd, STDERR_FILENO);
}

std::string eachRankLogFile(const std::string& dir, int rank) {
  static const std::string stamp = [] {
    char buf[32];
    const time_t now = time(nullptr);
    tm local{};
    localtime_r(&now, &local);
    strftime(buf, sizeof(buf), "%Y%m%d%H%M%S", &local);
    return std::string(buf);
  }();
  std::string d = dir;
  char cwd[4096] = {0};
  if ((d.empty() || d[0] != '/') && getcwd(cwd, sizeof(cwd))) d = std::string(cwd) + "/" + d;
  return d + "/" + stamp + "_rank" + std::to_string(rank) + ".log";
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

namespace {
// A rank failed while ranks on other hosts were running: name the hosts the
// launcher cannot reach any more (a link down), with their ranks, since the
// failure is most likely that (the failed rank was waiting for them).
void reportUnreachable(const Supervisor& sup, const Job& job) {
  std::map<std::string, std::vector<int>> byHost;
  for (int i = 0; i < static_cast<int>(job.ranks.size()); ++i)
    if (!job.ranks[i].host.empty() && sup.isRunning(i)) byHost[job.ranks[i].host].push_back(i);
  for (const auto& [host, ranks] : byHost) {
    try {
      ::close(rendezvous::connectWithRetry(host, job.sshPort, std::chrono::seconds(3), "host " + host));
    } catch (const std::exception&) {
      std::string list;
      for (int r : ranks) list += (list.empty() ? "" : ", ") + std::to_string(r);
      std::fprintf(stderr, "chorusrun: host %s does not answer (its sshd, port %d, within 3 s): ranks %s there "
                           "lost their link to the job\n", host.c_str(), job.sshPort, list.c_str());
    }
  }
}
}  // namespace

int runJob(const Job& job) {
  using Clock = std::chrono::steady_clock;
  const int np = static_cast<int>(job.ranks.size());
  installStopHandlers();
  Supervisor sup(job.outputDir, np, job.verbose);
  for (const auto& spec : job.ranks) sup.start(spec);

  int result = 0;
  bool stopping = false;
  auto killAt = Clock::time_point::max();
  auto drainUntil = Clock::time_point::max();
  auto stopAll = [&](int sig) {
    stopping = true;
    sup.signalAll(sig);
    killAt = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(job.killGraceSeconds * 1000));
  };
  while (true) {
    if (sup.running() == 0) {
      if (!sup.outputOpen()) break;
      if (drainUntil == Clock::time_point::max()) drainUntil = Clock::now() + std::chrono::seconds(2);
      if (Clock::now() > drainUntil) break;  // a grandchild holds a pipe open
    }
    for (const Ended& e : sup.poll(50)) {
      const bool failed = !(WIFEXITED(e.status) && WEXITSTATUS(e.status) == 0);
      if (!failed || stopping) continue;
      endOpenLine();  // chorusrun's own line starts a line of its own
      if (result == 0) result = exitCodeOf(e.status);
      const std::string what = describe(e.status, sup.spec(e.index).host);
      if (job.keepGoing) {
        std::fprintf(stderr, "chorusrun: rank %d %s; the other ranks run on (--keep-going)\n", e.index, what.c_str());
      } else {
        std::fprintf(stderr, "chorusrun: rank %d %s; stopping the other ranks\n", e.index, what.c_str());
        stopAll(SIGTERM);          // first: the probes below take seconds
        reportUnreachable(sup, job);  // (the stopped ranks are reaped later: still "running" here)
      }
    }
    if (stopSignal() && !stopping) {
      endOpenLine();
      std::fprintf(stderr, "chorusrun: interrupted (signal %d); stopping every rank\n", stopSignal());
      result = 128 + stopSignal();
      stopAll(SIGTERM);
    }
    if (stopping && Clock::now() > killAt) {
      sup.signalAll(SIGKILL);
      killAt = Clock::time_point::max();
    }
  }
  endOpenLine();
  if (result != 0 && job.verbose) std::fprintf(stderr, "chorusrun: job failed with exit code %d\n", result);
  return result;
}

}  // namespace chorus::launcher
