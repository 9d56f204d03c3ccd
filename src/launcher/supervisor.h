#pragma once
// Starts rank processes (local ones, or ssh to a remote agent), passes their
// output on tagged, and reaps them: what a plain job and the elastic driver share.
#include <sys/types.h>

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "launcher/output.h"

namespace chorus::launcher {

struct RankSpec {
  std::vector<std::string> argv;
  std::map<std::string, std::string> env;  // set in the child
  // Written to its standard input, which then stays open until the process ends or
  // is signalled (a remote rank's agent reads its environment from it, and stops
  // the rank when it closes). Empty: the process inherits chorusrun's input.
  std::string input;
  std::vector<int> cpus;  // empty: unbound
  std::string host;       // for messages; "" for this host
  int tag = 0;            // "[tag]<stdout>:"
};

struct Ended {
  int index;
  int status;  // waitpid's
};

class Supervisor {
 public:
  // outputDir: --output-filename's directory ("" none); logWidth: tags are padded
  // to the digits of logWidth - 1 in its file names.
  Supervisor(std::string outputDir, int logWidth, bool verbose);
  ~Supervisor();
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  int start(const RankSpec& spec);  // returns the process's index
  // Waits up to timeoutMs for output, passes it on, and reaps ended processes.
  std::vector<Ended> poll(int timeoutMs);
  // Closes the process's input and signals its process group.
  void signal(int index, int sig);
  void signalAll(int sig);
  int running() const;
  bool isRunning(int index) const;
  bool running(int index) const { return procs_[index].running; }
  bool outputOpen() const;
  const RankSpec& spec(int index) const { return procs_[index].spec; }

 private:
  struct Proc {
    RankSpec spec;
    pid_t pid = -1;
    bool running = false;
    int input = -1;  // write end of its standard input
  };
  void closeInput(Proc& p);

  std::string outputDir_;
  int logWidth_;
  bool verbose_;
  std::vector<Proc> procs_;
  std::vector<Stream*> streams_;  // stable addresses: output.cc remembers the open line's
  std::chrono::steady_clock::time_point lastBeat_{};
};

// "exited with code 3", "was killed by signal 9 (Killed) on host node2", ...: a
// remote rank's status is its agent's through ssh (128 + N for signal N, 255
// when ssh itself failed).
std::string describe(int status, const std::string& host);
// 0 for success, else the code, 128 + signal for a signal.
int exitCodeOf(int status);

// SIGINT and SIGTERM set a flag instead of ending chorusrun; stopSignal() reads it.
void installStopHandlers();
int stopSignal();

}  // namespace chorus::launcher
