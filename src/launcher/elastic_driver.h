#pragma once
// chorusrun's elastic mode (horovodrun --min-np/--max-np): hosts come from a
// discovery script, one worker process per slot, run by the elastic driver of
// src/rendezvous/elastic_rounds.h (which chorus.ray drives with Ray actors).
#include <string>
#include <vector>

#include "launcher/hosts.h"
#include "launcher/job_plan.h"

namespace chorus::launcher {

struct ElasticOptions {
  int minNp = 1;
  int maxNp = 0;  // 0: as many as the slots
  std::string discoveryScript;
  int slotsPerHost = 1;     // for discovered hosts listed without ":N"
  int resetLimit = -1;      // -1: no limit
  double cooldownMin = 0;   // --blacklist-cooldown-range: a failed host comes back after
  double cooldownMax = 0;   // a random time in [min, max] x 2^(failures-1); 0 0: never
  double elasticTimeout = 600;
  // A host is blacklisted when unreachable, when all its workers die together, or
  // after this many of its workers have failed (--blacklist-after-failures).
  int blacklistAfter = 3;
  double discoveryInterval = 1.0;
};

int runElastic(LaunchOptions o, const ElasticOptions& e);

// Parses the discovery script's output: "host" or "host:slots" per line.
std::vector<HostSlots> parseDiscovery(const std::string& text, int slotsPerHost);

}  // namespace chorus::launcher
