// chorusrun: starts the ranks of a job, as horovodrun does, with a rendezvous
// store that only answers requests carrying this job's secret.
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <thread>

#include "chorus/config.h"
#include "chorus/store.h"
#include "launcher/binding.h"
#include "launcher/hosts.h"
#include "launcher/spawn.h"

namespace {

volatile sig_atomic_t gStop = 0;
void onStop(int) { gStop = 1; }

int serveStore(const std::string& bind, int port, std::string secret) {
  if (secret.empty()) secret = chorus::generateSecret();
  auto server = chorus::startTcpStoreServer(bind, port, secret);
  std::printf("chorus store listening on %s:%d\n", bind.c_str(), server->port());
  std::printf("export CHORUS_RENDEZVOUS_ADDR=%s CHORUS_RENDEZVOUS_PORT=%d CHORUS_SECRET=%s\n",
              bind == "0.0.0.0" ? "<this host>" : bind.c_str(), server->port(), secret.c_str());
  std::fflush(stdout);
  signal(SIGINT, onStop);
  signal(SIGTERM, onStop);
  while (!gStop) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // horovodrun spells the process count "-np"; CLI11 wants one dash per letter.
  std::vector<std::string> args(argv, argv + argc);
  const std::vector<std::string> takesValue = {"-np", "-n", "--np", "--num-proc", "-H", "--hosts",
                                               "--hostfile", "--start-timeout", "--store-bind",
                                               "--store-port", "--secret", "--job-id", "--mpi-args",
                                               "--bind-to"};
  for (size_t i = 1; i < args.size(); ++i) {
    if (args[i] == "--" || args[i].empty() || args[i][0] != '-') break;  // the command starts here
    const bool hasValue = std::find(takesValue.begin(), takesValue.end(), args[i]) != takesValue.end();
    if (args[i] == "-np") args[i] = "--np";
    if (hasValue) ++i;
  }
  std::vector<char*> cargv;
  for (auto& a : args) cargv.push_back(a.data());

  CLI::App app{"chorusrun: start a chorus job (horovodrun's flags where they apply)"};
  app.prefix_command();  // everything after the options is the command
  int np = 0;
  std::string hosts, hostfile, bind = "127.0.0.1", secret, jobId, mpiArgs, bindTo = "none";
  bool useMpi = false;
  double startTimeout = 30;
  bool verbose = false, keepGoing = false, serve = false, printSettings = false;
  int port = 0;
  app.add_option("-n,--np,--num-proc", np, "number of ranks (also -np)");
  app.add_option("-H,--hosts", hosts, "hosts and slots, e.g. localhost:4");
  app.add_option("--hostfile", hostfile, "file with lines 'host slots=N'");
  app.add_option("--start-timeout", startTimeout, "seconds for every rank to start and meet")
      ->check(CLI::PositiveNumber);
  app.add_flag("--verbose", verbose, "print what chorusrun does");
  app.add_flag("--keep-going", keepGoing, "when a rank fails, let the others run on");
  app.add_flag("--serve-store", serve, "only run the rendezvous store (to start ranks by hand)");
  app.add_option("--store-bind", bind, "address the store listens on (default 127.0.0.1)");
  app.add_option("--store-port", port, "port of the store (default: any free port)");
  app.add_option("--secret", secret, "job secret for --serve-store (default: random)");
  app.add_flag("--mpi", useMpi, "start the ranks with mpirun (hosts from -H or --hostfile)");
  app.add_option("--mpi-args", mpiArgs, "extra arguments for mpirun, e.g. \"-x NCCL_DEBUG=INFO\"");
  app.add_option("--job-id", jobId, "job identity (default: chorusrun's pid and a random tag)");
  app.add_flag("--print-settings", printSettings, "print the table of CHORUS_* settings (markdown)");
  app.add_option("--bind-to", bindTo,
                 "CPU binding of the ranks: none (the default, as horovodrun), core (a block of cores per "
                 "rank, as mpirun), or auto (core when every rank can have a core of its own)");
  try {
    app.parse(static_cast<int>(cargv.size()), cargv.data());
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  // prefix_command() hands an unknown option over as the command; refuse it as
  // horovodrun (argparse) does. "--" ends the options for a command that starts with '-'.
  if (!app.remaining().empty()) {
    const std::string first = app.remaining()[0];
    if (first.size() > 1 && first[0] == '-' && first != "--") {
      std::fprintf(stderr,
                   "usage: chorusrun [options] [--] command ...\n"
                   "chorusrun: error: unrecognized arguments: %s\n"
                   "(chorusrun --help lists the options; put -- before a command that starts with '-')\n",
                   first.c_str());
      return 2;
    }
  }

  try {
    if (serve) return serveStore(bind, port, secret);
    if (printSettings) {
      std::printf("# chorus settings\n\nEvery setting is an environment variable; the HOROVOD_ name is accepted too.\n"
                  "This page is the output of `chorusrun --print-settings` (a test keeps them equal).\n\n"
                  "| variable | Horovod alias | default | meaning |\n|---|---|---|---|\n");
      for (const auto& s : chorus::settingsTable())
        std::printf("| `%s` | %s | %s | %s |\n", s.name, s.horovodAlias[0] ? (std::string("`") + s.horovodAlias + "`").c_str() : "",
                    s.defaultValue, s.meaning);
      return 0;
    }
    std::vector<std::string> command = app.remaining();
    if (!command.empty() && command[0] == "--") command.erase(command.begin());
    if (command.empty()) throw std::invalid_argument("no command given; usage: chorusrun -np N command ...");
    if (!hosts.empty() && !hostfile.empty()) throw std::invalid_argument("give -H or --hostfile, not both");
    std::vector<chorus::launcher::HostSlots> hostList;
    if (!hosts.empty()) hostList = chorus::launcher::parseHostList(hosts);
    if (!hostfile.empty()) hostList = chorus::launcher::parseHostfile(hostfile);
    if (useMpi) {
      if (np <= 0) throw std::invalid_argument("give the number of ranks with -np N");
      return chorus::launcher::runWithMpirun(np, hosts, hostfile, mpiArgs, command, verbose);
    }
    int slots = 0;
    for (const auto& h : hostList) {
      if (!chorus::launcher::isLocalHost(h.host)) {
        throw std::invalid_argument("host '" + h.host +
                                    "' is not this machine; chorusrun starts ranks on this host only for "
                                    "now (use mpirun for several hosts)");
      }
      slots += h.slots;
    }
    if (np <= 0) np = slots;
    if (np <= 0) throw std::invalid_argument("give the number of ranks with -np N");
    if (!hostList.empty() && np > slots) {
      throw std::invalid_argument(std::to_string(np) + " ranks requested but the hosts offer " +
                                  std::to_string(slots) + " slots");
    }

    const std::string jobSecret = chorus::generateSecret();
    if (jobId.empty()) jobId = std::to_string(getpid()) + "-" + jobSecret.substr(0, 8);
    if (jobId.find_first_of("/ ") != std::string::npos) throw std::invalid_argument("--job-id may not contain '/' or spaces");
    auto server = chorus::startTcpStoreServer("127.0.0.1", 0, jobSecret);
    chorus::launcher::LocalJob job;
    job.command = command;
    job.keepGoing = keepGoing;
    job.verbose = verbose;
    job.rankCpus = chorus::launcher::planBinding(bindTo, np);
    for (int r = 0; r < np; ++r) {
      std::map<std::string, std::string> env = {
          {"CHORUS_RANK", std::to_string(r)},
          {"CHORUS_SIZE", std::to_string(np)},
          {"CHORUS_LOCAL_RANK", std::to_string(r)},
          {"CHORUS_LOCAL_SIZE", std::to_string(np)},
          {"CHORUS_CROSS_RANK", "0"},
          {"CHORUS_CROSS_SIZE", "1"},
          {"CHORUS_RENDEZVOUS_ADDR", "127.0.0.1"},
          {"CHORUS_RENDEZVOUS_PORT", std::to_string(server->port())},
          {"CHORUS_SECRET", jobSecret},
          {"CHORUS_START_TIMEOUT", std::to_string(startTimeout)},
          {"CHORUS_JOB_ID", jobId},
      };
      // Programs written for Horovod read these.
      for (const char* k : {"RANK", "SIZE", "LOCAL_RANK", "LOCAL_SIZE", "CROSS_RANK", "CROSS_SIZE"})
        env[std::string("HOROVOD_") + k] = env[std::string("CHORUS_") + k];
      // ... and these, programs written for torch.distributed and DeepSpeed.
      env["RANK"] = env["CHORUS_RANK"];
      env["WORLD_SIZE"] = env["CHORUS_SIZE"];
      env["LOCAL_RANK"] = env["CHORUS_LOCAL_RANK"];
      env["LOCAL_WORLD_SIZE"] = env["CHORUS_LOCAL_SIZE"];
      job.rankEnv.push_back(std::move(env));
    }
    if (verbose) {
      std::fprintf(stderr, "chorusrun: %d ranks, store on 127.0.0.1:%d, command:", np, server->port());
      for (const auto& c : command) std::fprintf(stderr, " %s", c.c_str());
      std::fprintf(stderr, "\n");
      for (int r = 0; r < np; ++r) {
        std::string cpus;
        for (int c : job.rankCpus[r]) cpus += (cpus.empty() ? "" : ",") + std::to_string(c);
        std::fprintf(stderr, "chorusrun: rank %d runs on CPUs %s\n", r, cpus.empty() ? "(unbound)" : cpus.c_str());
      }
    }
    const int rc = chorus::launcher::runLocalJob(job);
    // Segments are unlinked once every rank has mapped them; a rank killed before
    // that leaves one behind, which goes now.
    const int removed = chorus::launcher::removeJobSegments(jobId);
    if (removed && verbose) std::fprintf(stderr, "chorusrun: removed %d stale shared-memory segments\n", removed);
    return rc;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "chorusrun: %s\n", e.what());
    return 2;
  }
}
