#pragma once
// Ranks on other hosts: started over ssh through chorusrun's rank agent, which
// reads the rank's environment from its standard input (so the job secret is on
// no command line) and stops the rank when that input closes, that is when the
// launcher or the ssh connection goes away.
#include <map>
#include <string>
#include <vector>

namespace chorus::launcher {

struct SshOptions {
  int port = 0;              // 0: ssh's own default
  std::string identityFile;  // -i
  std::string extra;         // more options, split at spaces ("-o ConnectTimeout=5 -F cfg")
};

// "ssh <options> host": horovodrun's defaults (no passwords, no host-key prompts).
std::vector<std::string> sshCommand(const SshOptions& ssh, const std::string& host);
// The ssh options alone, as one string (mpirun's plm_rsh_agent).
std::string sshAgentString(const SshOptions& ssh);
std::string shellQuote(const std::string& s);

// Runs "ssh host true" on every host at once; throws naming each host that did
// not answer within timeoutSeconds, with what ssh said.
void checkReachable(const std::vector<std::string>& hosts, const SshOptions& ssh, double timeoutSeconds);

// The argv that runs command on host under the agent (agentPath: this chorusrun).
std::vector<std::string> remoteRankArgv(const SshOptions& ssh, const std::string& host, const std::string& agentPath,
                                        const std::string& cwd, const std::vector<std::string>& command);
// The agent's first input: the rank's environment.
std::string encodeEnvironment(const std::map<std::string, std::string>& env);

// Runs "chorusrun --remove-segments JOB" on every host (after the job); returns
// how many stale shared-memory segments they removed. Unreachable hosts count 0.
int removeRemoteSegments(const std::vector<std::string>& hosts, const SshOptions& ssh, const std::string& agentPath,
                         const std::string& jobId);

// chorusrun --rank-agent CWD COMMAND...: the remote end. Returns the exit code
// to leave with (the rank's, or 128 + its signal).
int runRankAgent(const std::string& cwd, const std::vector<std::string>& command);

}  // namespace chorus::launcher
