// chorusrun: starts the ranks of a job, as horovodrun does, with a rendezvous
// store that only answers requests carrying this job's secret.
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <thread>

#include "chorus/config.h"
#include "chorus/store.h"
#include "launcher/check_build.h"
#include "launcher/elastic_driver.h"
#include "launcher/job_plan.h"
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

bool invokedAs(const char* arg0, std::initializer_list<const char*> names) {
  std::string base = arg0;
  if (base.find('/') != std::string::npos) base = base.substr(base.rfind('/') + 1);
  for (const char* n : names)
    if (base == n) return true;
  return false;
}

}  // namespace

// --autotuning: the autotuner (Python) runs each experiment as this chorusrun, with
// the same options but --autotuning, and the script's config argument replaced.
int runAutotuner(const chorus::launcher::LaunchOptions& o, const std::string& mode, std::vector<std::string> args) {
  // An experiment is a chorusrun job the autotuner started: it must not tune again.
  if (const char* child = std::getenv("CHORUS_AUTOTUNING_EXPERIMENT"); child && *child) {
    std::fprintf(stderr, "chorusrun: --autotuning inside an autotuning experiment (%s); refused\n", child);
    return 2;
  }
  for (size_t i = 1; i < args.size(); ++i) {  // (the first one: chorusrun's options come before the command)
    if (args[i] == "--") break;
    if (args[i].rfind("--autotuning=", 0) == 0) {
      args.erase(args.begin() + static_cast<std::ptrdiff_t>(i));
      break;
    }
    if (args[i] == "--autotuning" && i + 1 < args.size()) {
      args.erase(args.begin() + static_cast<std::ptrdiff_t>(i), args.begin() + static_cast<std::ptrdiff_t>(i + 2));
      break;
    }
  }
  std::vector<std::string> cmd = {chorus::launcher::pythonForScripts(o), "-m", "chorus.deepspeed.autotuning", mode,
                                  "--chorusrun", chorus::launcher::selfPath(), "--ranks",
                                  std::to_string(o.np > 0 ? o.np : 1), "--"};
  cmd.insert(cmd.end(), args.begin() + 1, args.end());
  std::vector<char*> cargs;
  for (auto& a : cmd) cargs.push_back(a.data());
  cargs.push_back(nullptr);
  std::fflush(stdout);
  execvp(cargs[0], cargs.data());
  std::fprintf(stderr, "chorusrun: cannot start the autotuner with %s: %s\n", cmd[0].c_str(), std::strerror(errno));
  return 2;
}

int main(int argc, char** argv) {
  // Internal modes, run on remote hosts over ssh (not options for users).
  if (argc >= 3 && std::string(argv[1]) == "--rank-agent")
    return chorus::launcher::runRankAgent(argv[2], std::vector<std::string>(argv + 3, argv + argc));
  if (argc == 3 && std::string(argv[1]) == "--remove-segments") {
    std::printf("%d\n", chorus::launcher::removeJobSegments(argv[2]));
    return 0;
  }
  // horovodrun spells the process count "-np"; CLI11 wants one dash per letter.
  std::vector<std::string> args(argv, argv + argc);
  const std::vector<std::string> takesValue = {
      "-np", "-n", "--np", "--num-proc", "-H", "--hosts", "--hostfile", "--start-timeout", "--store-bind",
      "--store-port", "--secret", "--job-id", "--mpi-args", "--bind-to", "-x", "-p", "--ssh-port", "-i",
      "--ssh-identity-file", "--ssh-options", "--network-interface", "--network-prefix", "--output-filename",
      "--num_nodes", "--num_gpus", "--num_procs", "--include", "--exclude", "--master_addr", "--master_port",
      "--min-np", "--max-np", "--host-discovery-script", "--slots-per-host", "--slots", "--reset-limit",
      "--blacklist-after-failures",
      "--elastic-timeout", "--autotune-log-file", "--autotune-warmup-samples", "--autotune-steps-per-sample",
      "--autotune-bayes-opt-max-samples", "--autotune-gaussian-process-noise", "--python", "--enable_each_rank_log",
      "--log-level", "--timeline-filename", "--autotuning"};
  for (size_t i = 1; i < args.size(); ++i) {
    if (args[i] == "--" || args[i].empty() || args[i][0] != '-') break;  // the command starts here
    const bool hasValue = std::find(takesValue.begin(), takesValue.end(), args[i]) != takesValue.end();
    if (args[i] == "-np") args[i] = "--np";
    if (hasValue) ++i;
    if (args[i] == "--blacklist-cooldown-range") i += 2;
  }
  std::vector<char*> cargv;
  for (auto& a : args) cargv.push_back(a.data());

  CLI::App app{"chorusrun: start a chorus job (horovodrun's and DeepSpeed's launcher flags where they apply)"};
  app.prefix_command();  // everything after the options is the command
  chorus::launcher::LaunchOptions o;
  std::string bind = "127.0.0.1", secret;
  bool serve = false, printSettings = false, gloo = false;
  int port = 0;
  app.add_option("-n,--np,--num-proc", o.np, "number of ranks (also -np)");
  app.add_option("-H,--hosts", o.hosts, "hosts and slots, e.g. node1:2,node2:2");
  app.add_option("--hostfile", o.hostfile, "file with lines 'host slots=N' or 'host:N' ('#' comments)");
  app.add_option("--start-timeout", o.startTimeout, "seconds for every rank to start and meet")
      ->check(CLI::PositiveNumber);
  app.add_flag("--verbose", o.verbose, "print what chorusrun does");
  app.add_flag("--keep-going", o.keepGoing, "when a rank fails, let the others run on");
  app.add_option("-p,--ssh-port", o.ssh.port, "ssh port of the remote hosts");
  app.add_option("-i,--ssh-identity-file", o.ssh.identityFile, "ssh private key for the remote hosts");
  app.add_option("--ssh-options", o.ssh.extra, "more ssh options, e.g. \"-o ConnectTimeout=5 -F ssh_config\"");
  app.add_option("-x", o.exports, "NAME or NAME=VALUE: pass a variable to every rank (repeatable, as mpirun's -x)")
      ->allow_extra_args(false);
  app.add_option("--network-interface", o.networkInterface,
                 "interface the store and the TCP transport use (e.g. eth0)");
  app.add_option("--network-prefix", o.networkPrefix, "network the store and the TCP transport use (e.g. 10.0.0.0/24)");
  app.add_option("--output-filename", o.outputDir, "also write each rank's output to DIR/rank.N/stdout and stderr");
  app.add_flag("--gloo", gloo, "chorus's own TCP controller (the default; as horovodrun --gloo)");
  app.add_flag("--serve-store", serve, "only run the rendezvous store (to start ranks by hand)");
  app.add_option("--store-bind", bind, "address the store listens on (default 127.0.0.1)");
  app.add_option("--store-port", port, "port of the store (default: any free port)");
  app.add_option("--secret", secret, "job secret for --serve-store (default: random)");
  app.add_flag("--mpi", o.useMpi, "start the ranks with mpirun (hosts from -H or --hostfile)");
  app.add_option("--mpi-args", o.mpiArgs, "extra arguments for mpirun, e.g. \"-x NCCL_DEBUG=INFO\"");
  app.add_option("--job-id", o.jobId, "job identity (default: chorusrun's pid and a random tag)");
  app.add_flag("--print-settings", printSettings, "print the table of CHORUS_* settings (markdown)");
  bool version = false, checkBuild = false;
  std::string logLevel, timeline;
  app.add_flag("--version", version, "print chorus's version and exit");
  app.add_flag("--check-build", checkBuild, "print the frameworks, controllers and tensor operations available");
  app.add_option("--python", o.python, "the Python that runs .py scripts (default: the one running chorusrun)");
  app.add_option("--log-level", logLevel, "CHORUS_LOG_LEVEL for every rank: trace, debug, info, warning, error");
  app.add_option("--timeline-filename", timeline, "rank 0 writes a Chrome trace of the job here (CHORUS_TIMELINE)");
  app.add_option("--bind-to", o.bindTo,
                 "CPU binding of the local ranks: none (the default, as horovodrun), core (a block of cores per "
                 "rank, as mpirun), or auto (core when every rank can have a core of its own)");
  auto* ds = "DeepSpeed launcher";
  app.add_option("--num_nodes", o.numNodes, "use the first N hosts of the host list")->group(ds);
  app.add_option("--num_gpus,--num_procs", o.numProcs, "ranks per host")->group(ds);
  app.add_option("--include", o.include, "only these hosts/slots, e.g. node1@node2:0,1")->group(ds);
  app.add_option("--exclude", o.exclude, "not these hosts/slots, e.g. node2:1")->group(ds);
  app.add_option("--master_addr", o.masterAddr, "address the store listens on and ranks meet at")->group(ds);
  app.add_option("--master_port", o.masterPort, "port of the store")->group(ds);
  app.add_flag("--no_python", o.noPython, "run the command as it is, even a .py file")->group(ds);
  app.add_flag("--module", o.module, "run the command as a Python module (python -m)")->group(ds);
  app.add_flag("--no_local_rank", o.noLocalRank, "started as deepspeed: do not pass --local_rank=N")->group(ds);
  app.add_option("--enable_each_rank_log", o.eachRankLog, "each rank's output to DIR/<time>_rank<N>.log")
      ->group(ds);
  std::string autotuning;
  app.add_option("--autotuning", autotuning,
                 "tune: run the DeepSpeed script's experiments (ZeRO stages, micro-batch sizes) and write the best "
                 "config; run: then train with it")
      ->check(CLI::IsMember({"tune", "run"}))
      ->group(ds);
  chorus::launcher::ElasticOptions el;
  std::vector<double> cooldown;
  auto* elastic = "Elastic training (horovodrun's)";
  app.add_option("--min-np", el.minNp, "fewest workers the job runs with")->group(elastic);
  app.add_option("--max-np", el.maxNp, "most workers the job runs with")->group(elastic);
  app.add_option("--host-discovery-script", el.discoveryScript,
                 "prints the usable hosts, 'host' or 'host:slots' per line; run every second")
      ->group(elastic);
  app.add_option("--slots-per-host,--slots", el.slotsPerHost, "slots of a discovered host listed without ':N'")
      ->group(elastic);
  app.add_option("--reset-limit", el.resetLimit, "fail after this many resets")->group(elastic);
  app.add_option("--blacklist-after-failures", el.blacklistAfter,
                 "blacklist a host after this many worker failures (also when unreachable or all its workers die)")
      ->group(elastic);
  app.add_option("--blacklist-cooldown-range", cooldown,
                 "MIN MAX: a failed host comes back after a random time in this range (seconds), doubled at "
                 "each failure; without it a failed host stays out")
      ->expected(2)
      ->group(elastic);
  app.add_option("--elastic-timeout", el.elasticTimeout,
                 "seconds to wait for at least --min-np workers before failing (default 600)")
      ->group(elastic);
  // horovodrun's autotune flags become the ranks' settings.
  bool autotune = false;
  std::string autotuneLog, warmup, steps, samples, noise;
  auto* tune = "Autotune (horovodrun's)";
  app.add_flag("--autotune", autotune, "tune the fusion threshold and cycle time while the job runs")->group(tune);
  app.add_option("--autotune-log-file", autotuneLog, "CSV of every autotune sample and the chosen point")
      ->group(tune);
  app.add_option("--autotune-warmup-samples", warmup, "samples not scored at the start")->group(tune);
  app.add_option("--autotune-steps-per-sample", steps, "busy negotiation cycles per sample")->group(tune);
  app.add_option("--autotune-bayes-opt-max-samples", samples, "scored samples before the best is kept")
      ->group(tune);
  app.add_option("--autotune-gaussian-process-noise", noise, "the Gaussian process's noise")->group(tune);
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

  for (const auto& [flag, name] : std::vector<std::pair<std::string, std::string>>{
           {autotune ? "1" : "", "CHORUS_AUTOTUNE"}, {autotuneLog, "CHORUS_AUTOTUNE_LOG"},
           {warmup, "CHORUS_AUTOTUNE_WARMUP_SAMPLES"}, {steps, "CHORUS_AUTOTUNE_STEPS_PER_SAMPLE"},
           {samples, "CHORUS_AUTOTUNE_BAYES_OPT_MAX_SAMPLES"}, {noise, "CHORUS_AUTOTUNE_GAUSSIAN_PROCESS_NOISE"},
           {logLevel, "CHORUS_LOG_LEVEL"}, {timeline, "CHORUS_TIMELINE"}})
    if (!flag.empty()) o.exports.push_back(name + "=" + flag);

  o.storePort = port;
  // The user's CHORUS_START_TIMEOUT (or Horovod's name) holds unless --start-timeout is given.
  if (!app.count("--start-timeout")) {
    for (const char* name : {"CHORUS_START_TIMEOUT", "HOROVOD_START_TIMEOUT"}) {
      const char* v = std::getenv(name);
      if (!v || !*v) continue;
      char* end = nullptr;
      const double t = std::strtod(v, &end);
      if (*end || t <= 0) {
        std::fprintf(stderr, "chorusrun: %s='%s' is not a positive number of seconds\n", name, v);
        return 2;
      }
      o.startTimeout = t;
      break;
    }
  }
  o.deepspeedForm = invokedAs(argv[0], {"deepspeed", "ds"});
  try {
    if (version) {
      std::printf("chorus %s\n", CHORUS_VERSION);
      return 0;
    }
    if (checkBuild) return chorus::launcher::printCheckBuild(o);
    if (!logLevel.empty() && std::string(" trace debug info warning error fatal ").find(" " + logLevel + " ") ==
                                  std::string::npos)
      throw std::invalid_argument("--log-level '" + logLevel + "' is not one of trace, debug, info, warning, error, fatal");
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
    if (gloo && o.useMpi) throw std::invalid_argument("give --gloo or --mpi, not both");
    if (!autotuning.empty()) return runAutotuner(o, autotuning, args);
    o.command = app.remaining();
    if (!o.command.empty() && o.command[0] == "--") o.command.erase(o.command.begin());
    if (!el.discoveryScript.empty() || app.count("--min-np") || app.count("--max-np")) {
      if (cooldown.size() == 2) {
        el.cooldownMin = cooldown[0];
        el.cooldownMax = cooldown[1];
        if (el.cooldownMin < 0 || el.cooldownMax < el.cooldownMin)
          throw std::invalid_argument("--blacklist-cooldown-range needs 0 <= MIN <= MAX");
      }
      if (o.useMpi) throw std::invalid_argument("elastic jobs run without --mpi");
      return chorus::launcher::runElastic(o, el);
    }
    return chorus::launcher::launch(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "chorusrun: %s\n", e.what());
    return 2;
  }
}
