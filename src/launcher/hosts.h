#pragma once
// Host lists as horovodrun takes them: "-H a:2,b:2" or a hostfile.
#include <string>
#include <vector>

namespace chorus::launcher {

struct HostSlots {
  std::string host;
  int slots = 1;
};

// "localhost:2,127.0.0.1:2"; a host without ":N" has one slot. Throws on bad syntax.
std::vector<HostSlots> parseHostList(const std::string& spec);
// Lines "host slots=N", "host:N" or "host"; '#' starts a comment.
std::vector<HostSlots> parseHostfile(const std::string& path);
bool isLocalHost(const std::string& host);

// DeepSpeed's resource filters, "node1@node2:0,2": hosts separated by '@', each
// with all its slots or the listed slot indices. include keeps only what it
// names; exclude drops what it names (a host with no slots left goes). Throws on
// a host or slot the list does not have.
std::vector<HostSlots> includeHosts(const std::vector<HostSlots>& hosts, const std::string& spec);
std::vector<HostSlots> excludeHosts(const std::vector<HostSlots>& hosts, const std::string& spec);

}  // namespace chorus::launcher
