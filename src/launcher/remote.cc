#include "launcher/remote.h"

#include "chorus/settings.h"
#include "launcher/spawn.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <stdexcept>

namespace chorus::launcher {

namespace {
volatile sig_atomic_t gForward = 0;
void onForward(int sig) { gForward = sig; }

using Clock = std::chrono::steady_clock;
}  // namespace

std::string shellQuote(const std::string& s) {
  if (!s.empty() && s.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-./=:,+@%") ==
                        std::string::npos)
    return s;
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::vector<std::string> sshCommand(const SshOptions& ssh, const std::string& host) {
  std::vector<std::string> argv = {"ssh", "-o", "PasswordAuthentication=no", "-o", "StrictHostKeyChecking=no",
                                   "-o", "BatchMode=yes"};
  if (ssh.port > 0) argv.insert(argv.end(), {"-p", std::to_string(ssh.port)});
  if (!ssh.identityFile.empty()) argv.insert(argv.end(), {"-i", ssh.identityFile});
  std::istringstream extra(ssh.extra);
  for (std::string a; extra >> a;) argv.push_back(a);
  argv.push_back(host);
  return argv;
}

std::string sshAgentString(const SshOptions& ssh) {
  std::vector<std::string> argv = sshCommand(ssh, "");
  argv.pop_back();
  std::string out;
  for (const auto& a : argv) out += (out.empty() ? "" : " ") + a;
  return out;
}

void checkReachable(const std::vector<std::string>& hosts, const SshOptions& ssh, double timeoutSeconds) {
  struct Probe {
    std::string host;
    pid_t pid = -1;
    int errFd = -1;
    std::string said;
    int status = -1;
  };
  std::vector<Probe> probes;
  const int connectTimeout = std::max(1, static_cast<int>(timeoutSeconds));
  for (const auto& h : hosts) {
    int err[2];
    if (pipe2(err, O_CLOEXEC) != 0) throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
    std::vector<std::string> argv = sshCommand(ssh, h);
    argv.insert(argv.begin() + 1, {"-o", "ConnectTimeout=" + std::to_string(connectTimeout)});
    argv.push_back("true");
    const pid_t pid = fork();
    if (pid == 0) {
      const int null = open("/dev/null", O_RDWR);
      dup2(null, STDIN_FILENO);
      dup2(null, STDOUT_FILENO);
      dup2(err[1], STDERR_FILENO);
      std::vector<char*> av;
      for (auto& a : argv) av.push_back(a.data());
      av.push_back(nullptr);
      execvp(av[0], av.data());
      std::fprintf(stderr, "cannot run ssh: %s (install openssh-client)", std::strerror(errno));
      _exit(127);
    }
    close(err[1]);
    fcntl(err[0], F_SETFL, O_NONBLOCK);
    probes.push_back({h, pid, err[0], "", -1});
  }
  const auto deadline = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(timeoutSeconds * 1000) + 2000);
  size_t left = probes.size();
  while (left > 0 && Clock::now() < deadline) {
    for (auto& p : probes) {
      char buf[4096];
      ssize_t n;
      while (p.errFd >= 0 && (n = read(p.errFd, buf, sizeof(buf))) > 0) p.said.append(buf, static_cast<size_t>(n));
      if (p.status == -1 && waitpid(p.pid, &p.status, WNOHANG) == p.pid) --left;
    }
    if (left) usleep(20000);
  }
  std::string failed;
  for (auto& p : probes) {
    if (p.status == -1) {
      kill(p.pid, SIGKILL);
      waitpid(p.pid, &p.status, 0);
      p.said = "no answer within " + std::to_string(static_cast<int>(timeoutSeconds)) + " s";
      p.status = 1 << 8;
    }
    if (p.errFd >= 0) close(p.errFd);
    if (WIFEXITED(p.status) && WEXITSTATUS(p.status) == 0) continue;
    while (!p.said.empty() && (p.said.back() == '\n' || p.said.back() == '\r')) p.said.pop_back();
    failed += "\n  host '" + p.host + "' is not reachable over ssh: " + (p.said.empty() ? "ssh failed" : p.said);
  }
  if (!failed.empty()) throw std::invalid_argument("nothing was started:" + failed);
}

std::vector<std::string> remoteRankArgv(const SshOptions& ssh, const std::string& host, const std::string& agentPath,
                                        const std::string& cwd, const std::vector<std::string>& command) {
  std::vector<std::string> argv = sshCommand(ssh, host);
  std::string remote = shellQuote(agentPath) + " --rank-agent " + shellQuote(cwd);
  for (const auto& c : command) remote += " " + shellQuote(c);
  argv.push_back(remote);
  return argv;
}

int removeRemoteSegments(const std::vector<std::string>& hosts, const SshOptions& ssh, const std::string& agentPath,
                         const std::string& jobId) {
  std::vector<std::pair<pid_t, int>> running;
  for (const auto& h : hosts) {
    int out[2];
    if (pipe2(out, O_CLOEXEC) != 0) continue;
    std::vector<std::string> argv = sshCommand(ssh, h);
    argv.insert(argv.begin() + 1, {"-o", "ConnectTimeout=5"});
    argv.push_back(shellQuote(agentPath) + " --remove-segments " + shellQuote(jobId));
    const pid_t pid = fork();
    if (pid == 0) {
      const int null = open("/dev/null", O_RDWR);
      dup2(null, STDIN_FILENO);
      dup2(out[1], STDOUT_FILENO);
      dup2(null, STDERR_FILENO);
      std::vector<char*> av;
      for (auto& a : argv) av.push_back(a.data());
      av.push_back(nullptr);
      execvp(av[0], av.data());
      _exit(127);
    }
    close(out[1]);
    running.emplace_back(pid, out[0]);
  }
  int removed = 0;
  for (auto [pid, fd] : running) {
    std::string said;
    char buf[256];
    for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) said.append(buf, static_cast<size_t>(n));
    close(fd);
    waitpid(pid, nullptr, 0);
    removed += std::atoi(said.c_str());
  }
  return removed;
}

std::string encodeEnvironment(const std::map<std::string, std::string>& env) {
  std::string out;
  for (const auto& [k, v] : env) {
    out += k + "=" + v;
    out.push_back('\0');
  }
  out.push_back('\0');  // an empty entry ends the block
  return out;
}

int runRankAgent(const std::string& cwd, const std::vector<std::string>& command) {
  // The environment block, byte by byte (it is small) so nothing past it is consumed.
  std::string entry;
  while (true) {
    char c;
    const ssize_t n = read(STDIN_FILENO, &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      std::fprintf(stderr, "chorusrun agent: the launcher went away before the rank started\n");
      return 255;
    }
    if (c != '\0') {
      entry.push_back(c);
      continue;
    }
    if (entry.empty()) break;
    const size_t eq = entry.find('=');
    if (eq != std::string::npos) setenv(entry.substr(0, eq).c_str(), entry.substr(eq + 1).c_str(), 1);
    entry.clear();
  }
  std::string beat;
  // The launcher writes every second. A lossy link stalls TCP for many seconds
  // (retransmission backoff) while the connection lives: only a long silence is
  // taken for a lost launcher (its death closes this input at once anyway).
  const double silence = readSetting("CHORUS_AGENT_TIMEOUT", &beat) ? std::atof(beat.c_str()) : 60.0;
  if (chdir(cwd.c_str()) != 0) {
    // As horovodrun: the rank starts in the home directory when the launcher's is not here.
  }
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    stopWithParent(parent);
    const int null = open("/dev/null", O_RDONLY);
    dup2(null, STDIN_FILENO);
    redirectToRankLog();
    std::vector<char*> argv;
    for (const auto& a : command) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execvp(argv[0], argv.data());
    std::fprintf(stderr, "chorusrun: cannot run '%s': %s\n", argv[0], std::strerror(errno));
    _exit(127);
  }
  setpgid(pid, pid);
  struct sigaction sa {};
  sa.sa_handler = onForward;
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) sigaction(sig, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);
  auto killAt = Clock::time_point::max();
  auto heard = Clock::now();
  bool inputOpen = true;
  int status = 0;
  while (true) {
    const pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid) break;
    if (gForward) {
      kill(-pid, gForward);
      gForward = 0;
    }
    if (inputOpen) {
      pollfd p{STDIN_FILENO, POLLIN, 0};
      if (poll(&p, 1, 100) > 0) {
        char buf[256];
        const ssize_t n = read(STDIN_FILENO, buf, sizeof(buf));
        if (n > 0) heard = Clock::now();
        if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) {
          inputOpen = false;  // the launcher or the connection is gone: stop the rank
          kill(-pid, SIGTERM);
          killAt = Clock::now() + std::chrono::seconds(5);
        }
      }
      if (inputOpen && silence > 0 && std::chrono::duration<double>(Clock::now() - heard).count() > silence) {
        std::fprintf(stderr, "chorusrun agent: no word from the launcher for %.0f s; stopping the rank\n", silence);
        inputOpen = false;  // the link to the launcher is down
        kill(-pid, SIGTERM);
        killAt = Clock::now() + std::chrono::seconds(5);
      }
    } else {
      usleep(50000);
    }
    if (Clock::now() > killAt) {
      kill(-pid, SIGKILL);
      killAt = Clock::time_point::max();
    }
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

}  // namespace chorus::launcher
