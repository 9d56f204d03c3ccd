#include "launcher/hosts.h"

#include <unistd.h>

#include <fstream>
#include <sstream>
#include <stdexcept>

namespace chorus::launcher {

namespace {
int parseSlots(const std::string& s, const std::string& where) {
  try {
    size_t used = 0;
    int n = std::stoi(s, &used);
    if (used != s.size() || n <= 0) throw std::invalid_argument(s);
    return n;
  } catch (const std::exception&) {
    throw std::invalid_argument(where + ": slot count '" + s + "' is not a positive integer");
  }
}

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r");
  size_t e = s.find_last_not_of(" \t\r");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}
}  // namespace

std::vector<HostSlots> parseHostList(const std::string& spec) {
  std::vector<HostSlots> out;
  std::stringstream ss(spec);
  std::string item;
  while (std::getline(ss, item, ',')) {
    item = trim(item);
    if (item.empty()) throw std::invalid_argument("host list '" + spec + "' has an empty entry");
    HostSlots h;
    size_t colon = item.rfind(':');
    if (colon == std::string::npos) {
      h.host = item;
    } else {
      h.host = item.substr(0, colon);
      h.slots = parseSlots(item.substr(colon + 1), "host '" + item + "'");
    }
    if (h.host.empty()) throw std::invalid_argument("host list '" + spec + "': missing host name");
    out.push_back(h);
  }
  if (out.empty()) throw std::invalid_argument("empty host list");
  return out;
}

std::vector<HostSlots> parseHostfile(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::invalid_argument("cannot read hostfile '" + path + "'");
  std::vector<HostSlots> out;
  std::string line;
  int lineNo = 0;
  while (std::getline(in, line)) {
    ++lineNo;
    line = trim(line.substr(0, line.find('#')));
    if (line.empty()) continue;
    const std::string where = path + ":" + std::to_string(lineNo);
    std::stringstream ls(line);
    std::string host, field;
    ls >> host;
    HostSlots h;
    size_t colon = host.rfind(':');
    if (colon != std::string::npos) {
      h.slots = parseSlots(host.substr(colon + 1), where);
      host = host.substr(0, colon);
    }
    h.host = host;
    while (ls >> field) {
      if (field.rfind("slots=", 0) == 0) {
        h.slots = parseSlots(field.substr(6), where);
      } else if (field.rfind("max_slots=", 0) != 0) {
        throw std::invalid_argument(where + ": unknown field '" + field + "' (expected slots=N)");
      }
    }
    out.push_back(h);
  }
  if (out.empty()) throw std::invalid_argument("hostfile '" + path + "' lists no hosts");
  return out;
}

bool isLocalHost(const std::string& host) {
  if (host == "localhost" || host == "127.0.0.1" || host == "::1" || host == "localhost.localdomain")
    return true;
  char name[256] = {0};
  gethostname(name, sizeof(name) - 1);
  std::string me = name;
  return host == me || me.rfind(host + ".", 0) == 0 || host.rfind(me + ".", 0) == 0;
}

}  // namespace chorus::launcher
