// Process-level behaviour through chorusrun: what only real processes show.
#include <gtest/gtest.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <regex>
#include <string>
#include <vector>

namespace {

struct Result {
  int exitCode;
  std::string output;
};

Result run(const std::string& cmd) {
  Result r{-1, ""};
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.output.append(buf.data(), n);
  int status = pclose(p);
  r.exitCode = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

const std::string kRun = CHORUSRUN_PATH;
const std::string kWorker = WORKER_PATH;

int count(const std::string& text, const std::string& needle) {
  int c = 0;
  for (size_t pos = text.find(needle); pos != std::string::npos; pos = text.find(needle, pos + 1)) ++c;
  return c;
}

TEST(ChorusRun, MismatchIsReportedOnAllRanksAndTheNextCollectiveRuns) {
  auto r = run(kRun + " -np 3 " + kWorker + " mismatch");
  EXPECT_EQ(r.exitCode, 0) << r.output;
  for (int rank = 0; rank < 3; ++rank) {
    std::string tag = "[" + std::to_string(rank) + "]<stdout>:";
    EXPECT_NE(r.output.find(tag + "mismatch on rank " + std::to_string(rank) +
                            ": Mismatched allreduce for tensor 'weights': dtype float32 on ranks [0, 2], "
                            "float64 on ranks [1]"),
              std::string::npos)
        << r.output;
    EXPECT_NE(r.output.find(tag + "next collective on rank " + std::to_string(rank) + " gave 3"), std::string::npos)
        << r.output;
  }
}

// env: settings for the job (the data path); scenario: kill, kill_small or kill_direct.
void expectKilledRankIsPeerFailure(const std::string& env, const std::string& scenario = "kill") {
  auto r = run(env + " CHORUS_TIMEOUT_SECONDS=10 " + kRun + " --keep-going -np 3 " + kWorker + " " + scenario);
  EXPECT_EQ(r.exitCode, 128 + 9) << r.output;
  EXPECT_NE(r.output.find("chorusrun: rank 1 was killed by signal 9"), std::string::npos) << r.output;
  for (int rank : {0, 2}) {
    std::smatch m;
    std::regex re("peer failure on rank " + std::to_string(rank) + " after ([0-9.]+) s");
    ASSERT_TRUE(std::regex_search(r.output, m, re)) << r.output;
    EXPECT_LT(std::stod(m[1]), 10.0 + 5.0) << "not within the timeout";
    EXPECT_NE(r.output.find("later collective failed too on rank " + std::to_string(rank)), std::string::npos);
    EXPECT_NE(r.output.find("shutdown done on rank " + std::to_string(rank)), std::string::npos);
  }
}

TEST(ChorusRun, KilledRankBecomesPeerFailureOnTheSurvivors) { expectKilledRankIsPeerFailure(""); }

// The kill lands while the ranks read and write each other's pool buffers.
TEST(ChorusRun, KilledRankInADirectSharedMemoryOpBecomesPeerFailure) {
  expectKilledRankIsPeerFailure("", "kill_direct");
}

// Over TCP the kill lands in Gloo's large allreduces, or in the small ones over the direct mesh.
TEST(ChorusRun, KilledRankBecomesPeerFailureOverTcp) {
  expectKilledRankIsPeerFailure("CHORUS_CPU_OPERATIONS=tcp");
  expectKilledRankIsPeerFailure("CHORUS_CPU_OPERATIONS=tcp", "kill_small");
}

// The CPUs the rank's process may run on, as the kernel reports them.
std::string cpusOfRank(const std::string& output, int rank) {
  std::smatch m;
  std::regex re("\\[" + std::to_string(rank) + "\\]<stdout>:Cpus_allowed_list:\\s*([0-9,-]+)");
  return std::regex_search(output, m, re) ? m[1].str() : "";
}

int allowedCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  return sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 0;
}

TEST(ChorusRun, BindsEachRankToItsOwnCoresWhenAsked) {
  const std::string show = " sh -c 'grep Cpus_allowed_list /proc/self/status'";
  auto all = run("sh -c 'grep Cpus_allowed_list /proc/self/status'");
  const std::string whole = all.output.substr(all.output.find_first_of("0123456789"));
  // Unbound by default, as horovodrun.
  auto plain = run(kRun + " -np 2" + show);
  ASSERT_EQ(plain.exitCode, 0) << plain.output;
  for (int rank = 0; rank < 2; ++rank) EXPECT_EQ(cpusOfRank(plain.output, rank) + "\n", whole) << plain.output;
  if (allowedCpus() >= 2) {
    auto r = run(kRun + " --bind-to auto -np 2" + show);
    ASSERT_EQ(r.exitCode, 0) << r.output;
    const std::string a = cpusOfRank(r.output, 0), b = cpusOfRank(r.output, 1);
    ASSERT_FALSE(a.empty()) << r.output;
    ASSERT_FALSE(b.empty()) << r.output;
    EXPECT_NE(a, b) << r.output;
    EXPECT_NE(a + "\n", whole) << "rank 0 was not bound: " << r.output;
  }
  // More ranks than CPUs: auto leaves them unbound; core refuses, saying why.
  const int many = allowedCpus() + 1;
  auto over = run(kRun + " --bind-to auto -np " + std::to_string(many) + show);
  ASSERT_EQ(over.exitCode, 0) << over.output;
  for (int rank = 0; rank < many; ++rank) EXPECT_EQ(cpusOfRank(over.output, rank) + "\n", whole) << over.output;
  auto refused = run(kRun + " --bind-to core -np " + std::to_string(many) + " true");
  EXPECT_EQ(refused.exitCode, 2) << refused.output;
  EXPECT_NE(refused.output.find("--bind-to core: " + std::to_string(many) + " ranks but only"), std::string::npos)
      << refused.output;
  auto bad = run(kRun + " --bind-to socket -np 1 true");
  EXPECT_EQ(bad.exitCode, 2) << bad.output;
  EXPECT_NE(bad.output.find("--bind-to socket: use auto, core or none"), std::string::npos) << bad.output;
}

TEST(ChorusRun, FailedRankStopsTheOthersWithoutKeepGoing) {
  auto r = run(kRun + " -np 3 sh -c 'if [ $CHORUS_RANK = 2 ]; then exit 7; fi; sleep 60'");
  EXPECT_EQ(r.exitCode, 7) << r.output;
  EXPECT_NE(r.output.find("chorusrun: rank 2 exited with code 7; stopping the other ranks"), std::string::npos)
      << r.output;
}

TEST(ChorusRun, StallWarningNamesTheTensorAndTheMissingRank) {
  auto r = run("CHORUS_STALL_CHECK_TIME_SECONDS=1 " + kRun + " -np 3 " + kWorker + " stall");
  EXPECT_EQ(r.exitCode, 0) << r.output;
  EXPECT_NE(r.output.find("[0]<stderr>:[chorus WARNING rank 0] Stalled ops on process set 0"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("'stalled.tensor' waited"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("ranks that have not submitted it: [2]"), std::string::npos) << r.output;
  EXPECT_EQ(count(r.output, "stalled tensor done on rank"), 3) << r.output;
}

TEST(ChorusRun, AStalledSetDoesNotHoldUpAnother) {
  auto r = run(kRun + " -np 3 " + kWorker + " two_sets");
  EXPECT_EQ(r.exitCode, 0) << r.output;
  EXPECT_NE(r.output.find("set 1 op pending: yes"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("set 1 result on rank 0 = 2"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("set 1 result on rank 1 = 2"), std::string::npos) << r.output;
}

TEST(ChorusRun, StoreRefusesRequestsWithoutTheSecret) {
  auto r = run(kRun + " -np 2 " + kWorker + " bad_secret");
  EXPECT_EQ(r.exitCode, 0) << r.output;
  EXPECT_EQ(count(r.output, "refused as expected"), 2) << r.output;
  // The first refusal from an address is logged with its reason; the second only counts
  // toward that address's summary line.
  EXPECT_EQ(count(r.output, "[chorus WARNING] chorus store: refused a connection from 127.0.0.1:"), 1) << r.output;
  EXPECT_NE(r.output.find("wrong job secret"), std::string::npos) << r.output;
}

// (Other hosts: tests/multihost, on namespace hosts.)
TEST(ChorusRun, RefusesBadHostListsAndTooFewSlots) {
  auto r = run(kRun + " -H localhost:1 -np 2 true");
  EXPECT_EQ(r.exitCode, 2);
  EXPECT_NE(r.output.find("2 ranks requested but the hosts offer 1 slots"), std::string::npos) << r.output;
  r = run("(f=$(mktemp); printf '# hosts\\nlocalhost slots=2\\n\\nlocalhost gpus=2\\n' > $f; " + kRun +
          " --hostfile $f true; rm -f $f)");
  EXPECT_NE(r.output.find(":4: unknown field 'gpus=2'"), std::string::npos) << r.output;
  r = run(kRun + " --num_nodes 1 --include localhost true");
  EXPECT_NE(r.output.find("cannot be combined"), std::string::npos) << r.output;
  r = run(kRun + " -H localhost:2 --exclude localhost:5 true");
  EXPECT_NE(r.output.find("--exclude: host 'localhost' has 2 slots; slot 5 does not exist"), std::string::npos)
      << r.output;
  r = run(kRun + " -H localhost:3 --exclude localhost:0,2 --verbose true");
  EXPECT_EQ(r.exitCode, 0) << r.output;
  EXPECT_NE(r.output.find("1 ranks on 1 hosts"), std::string::npos) << r.output;
}

TEST(ChorusRun, InterruptStopsEveryRank) {
  // chorusrun in the background, SIGINT after the ranks started; no rank may survive.
  auto r = run("tmp=$(mktemp); (" + kRun +
               " -np 3 sh -c 'echo $$ >> '$tmp'; sleep 60' & pid=$!; sleep 1; kill -INT $pid; wait $pid; "
               "echo exit=$?; sleep 0.5; for p in $(cat $tmp); do kill -0 $p 2>/dev/null && echo alive=$p; done; "
               "rm -f $tmp)");
  EXPECT_NE(r.output.find("interrupted"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("exit=130"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("alive="), std::string::npos) << r.output;
}

TEST(ChorusRun, RemovesSharedMemoryLeftByAKilledRank) {
  const std::string job = "leaktest" + std::to_string(getpid());
  auto r = run(kRun + " --job-id " + job + " -np 2 " + kWorker + " leak_before_attach");
  EXPECT_NE(r.exitCode, 0);
  EXPECT_NE(r.output.find("segments while waiting: 1"), std::string::npos) << r.output;
  auto after = run("ls /dev/shm | grep -c '^chorus-" + job + "-' || true");
  EXPECT_EQ(after.output, "0\n");
}

TEST(ChorusRun, KilledRankInSharedMemoryLeavesNoSegment) {
  const std::string job = "killtest" + std::to_string(getpid());
  auto r = run("CHORUS_TIMEOUT_SECONDS=10 " + kRun + " --job-id " + job + " --keep-going -np 3 " + kWorker + " kill");
  EXPECT_EQ(r.exitCode, 128 + 9) << r.output;
  auto after = run("ls /dev/shm | grep -c '^chorus-" + job + "-' || true");
  EXPECT_EQ(after.output, "0\n");
}

TEST(ChorusRun, TagsEveryLineWithItsRank) {
  auto r = run(kRun + " -np 2 sh -c 'echo out$CHORUS_RANK; echo err$CHORUS_RANK >&2'");
  EXPECT_EQ(r.exitCode, 0);
  for (const char* line : {"[0]<stdout>:out0", "[1]<stdout>:out1", "[0]<stderr>:err0", "[1]<stderr>:err1"})
    EXPECT_NE(r.output.find(line), std::string::npos) << r.output;
}

}  // namespace

namespace {

TEST(ChorusRun, RefusesAnUnknownOptionAndTakesDashDashAsTheEndOfOptions) {
  auto r = run(kRun + " --frobnicate -np 2 sh -c 'echo ran'");
  EXPECT_EQ(r.exitCode, 2) << r.output;
  EXPECT_NE(r.output.find("chorusrun: error: unrecognized arguments: --frobnicate"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("ran"), std::string::npos) << r.output;  // no rank started
  r = run(kRun + " -np 2 --bogus=3 true");
  EXPECT_EQ(r.exitCode, 2) << r.output;
  EXPECT_NE(r.output.find("unrecognized arguments: --bogus=3"), std::string::npos) << r.output;
  // After --, a leading dash belongs to the command.
  r = run(kRun + " -np 1 -- sh -c 'echo ok-$CHORUS_RANK'");
  EXPECT_EQ(r.exitCode, 0) << r.output;
  EXPECT_NE(r.output.find("[0]<stdout>:ok-0"), std::string::npos) << r.output;
  r = run(kRun + " -np 1 -- --not-an-option");
  EXPECT_EQ(r.output.find("unrecognized arguments"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("cannot run '--not-an-option'"), std::string::npos) << r.output;
}

}  // namespace

namespace {

TEST(ChorusRun, ProgressBarRedrawsCarryOneTagEach) {
  // A progress bar redraws its line with '\r' (tqdm writes "\r" + the bar); each
  // redraw starts with the tag once, and the bar's final newline ends the line.
  // (The sleeps keep stderr's and stdout's pipes in order.)
  auto r = run(kRun + " -np 1 sh -c \"printf '\\r 0%%|  |\\r50%%|# |' >&2; sleep 0.2; printf '\\r100%%|##|\\n' >&2; "
                      "sleep 0.2; echo after\"");
  EXPECT_EQ(r.exitCode, 0) << r.output;
  EXPECT_NE(r.output.find("\r[0]<stderr>: 0%|  |\r[0]<stderr>:50%|# |\r[0]<stderr>:100%|##|\n"), std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("]<stderr>:[0]"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[0]<stdout>:after\n"), std::string::npos) << r.output;
  // Text without a newline is shown as it comes and continued without a second tag.
  r = run(kRun + " -np 1 sh -c \"printf 'epoch 1: ' ; sleep 0.2; echo loss 0.5\"");
  EXPECT_NE(r.output.find("[0]<stdout>:epoch 1: loss 0.5\n"), std::string::npos) << r.output;
}

TEST(ChorusRun, LinesWrittenInPiecesStayWhole) {
  // print("a", x) under python -u writes its pieces one by one; the other ranks'
  // lines in between must not cut it (each rank's pieces 50 ms apart, together).
  auto r = run(kRun + " -np 3 sh -c \"sleep 0.1; printf 'first-%s ' \\$CHORUS_RANK; sleep 0.05; printf 'second-%s ' \\$CHORUS_RANK; "
                      "sleep 0.05; echo third-\\$CHORUS_RANK\"");
  EXPECT_EQ(r.exitCode, 0) << r.output;
  for (int rank = 0; rank < 3; ++rank) {
    const std::string k = std::to_string(rank);
    EXPECT_NE(r.output.find("[" + k + "]<stdout>:first-" + k + " second-" + k + " third-" + k + "\n"),
              std::string::npos)
        << r.output;
  }
}

}  // namespace

namespace {

// chorusrun's output read as it comes, never kept whole: the 'x's each rank's
// tag stands before, and whatever else came (bounded).
struct TaggedCount {
  std::map<int, int64_t> xs;  // by rank; -1: 'x's on a line without a tag
  std::string other;
  int64_t peakKiB = -1;       // chorusrun's peak RSS (and its reaped children's)
  int exitCode = -1;
};

TaggedCount runCounting(const std::vector<std::string>& args) {
  TaggedCount out;
  int fds[2];
  if (pipe(fds) != 0) return out;
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], 1);
    dup2(fds[1], 2);
    close(fds[0]);
    close(fds[1]);
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(fds[1]);
  bool lineStart = true, inTag = false;
  std::string tag;
  int rank = -1;
  auto note = [&](char c) {
    if (out.other.size() < 4096) out.other.push_back(c);
  };
  std::vector<char> buf(1 << 16);
  ssize_t n;
  while ((n = read(fds[0], buf.data(), buf.size())) > 0) {
    for (ssize_t i = 0; i < n; ++i) {
      const char c = buf[i];
      if (c == '\n') {
        lineStart = true;
        inTag = false;
        continue;
      }
      if (lineStart && c == '[') {
        lineStart = false;
        inTag = true;
        tag.clear();
        continue;
      }
      if (inTag) {
        if (c != ':' && tag.size() < 32) {
          tag.push_back(c);
          continue;
        }
        inTag = false;
        rank = tag.size() > 9 && tag.compare(tag.size() - 9, 9, "]<stdout>") == 0 ? std::atoi(tag.c_str()) : -2;
        if (rank == -2) note('?');
        continue;
      }
      if (lineStart) rank = -1;  // text without a tag
      lineStart = false;
      if (c == 'x') ++out.xs[rank];
      else note(c);
    }
  }
  close(fds[0]);
  int status = 0;
  rusage ru{};
  if (wait4(pid, &status, 0, &ru) == pid) {
    out.peakKiB = ru.ru_maxrss;
    out.exitCode = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  return out;
}

TEST(ChorusRun, ALineThatNeverEndsDoesNotGrowChorusrun) {
  // Two ranks write 100 MiB each without a newline. chorusrun holds at most a
  // bounded piece of an open line: every byte arrives, each piece under its
  // rank's tag, and chorusrun stays small (it held the whole line before).
  constexpr int64_t kBytes = 100LL << 20;
  const auto r = runCounting({kRun, "-np", "2", "sh", "-c", "head -c 100M /dev/zero | tr '\\0' x"});
  EXPECT_EQ(r.exitCode, 0) << r.other;
  EXPECT_EQ(r.xs.count(-1), 0u) << r.xs.at(-1) << " bytes arrived without a tag";
  EXPECT_EQ(r.xs.count(0) ? r.xs.at(0) : 0, kBytes) << r.other;
  EXPECT_EQ(r.xs.count(1) ? r.xs.at(1) : 0, kBytes) << r.other;
  EXPECT_EQ(r.other, "") << "text besides the ranks' bytes and tags";
  EXPECT_GT(r.peakKiB, 0);
  EXPECT_LT(r.peakKiB, 64 * 1024) << "chorusrun's peak RSS, KiB";
}

}  // namespace

namespace {

// Under torchrun's variables rank 0 serves chorus's store on MASTER_PORT+1;
// when a program that never answers has that port, rank 0 serves on the next
// candidate and rank 1, passing over the stranger, finds it.
TEST(TorchVariables, AStorePortTakenByAStrangerMovesToTheNextCandidate) {
  const int stranger = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  ASSERT_EQ(::bind(stranger, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(::listen(stranger, 16), 0);
  getsockname(stranger, reinterpret_cast<sockaddr*>(&a), &len);
  const int taken = ntohs(a.sin_port);
  auto rankCmd = [&](int r) {
    return "(RANK=" + std::to_string(r) + " WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" +
           std::to_string(taken - 1) + " CHORUS_START_TIMEOUT=30 " + kWorker + " mismatch; echo rank" +
           std::to_string(r) + " exit $?)";
  };
  auto r = run("sh -c '" + rankCmd(0) + " & " + rankCmd(1) + "; wait'");
  ::close(stranger);
  EXPECT_NE(r.output.find("rank0 exit 0"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rank1 exit 0"), std::string::npos) << r.output;
  for (int rank = 0; rank < 2; ++rank)
    EXPECT_NE(r.output.find("next collective on rank " + std::to_string(rank) + " gave 2"), std::string::npos)
        << r.output;
}

}  // namespace
