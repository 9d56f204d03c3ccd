#include "launcher/hosts.h"

#include "base/net_address.h"

#include <algorithm>
#include <fstream>
#include <set>
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

int parseIndex(const std::string& s, const std::string& where) {
  if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos || s.size() > 6)
    throw std::invalid_argument(where + ": slot index '" + s + "' is not a non-negative integer");
  return std::stoi(s);
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

bool isLocalHost(const std::string& host) { return host == "::1" || net::isThisHost(host); }

namespace {
// host -> the slot indices named (empty: every slot), in the order given.
std::vector<std::pair<std::string, std::vector<int>>> parseFilter(const std::string& spec) {
  std::vector<std::pair<std::string, std::vector<int>>> out;
  std::stringstream ss(spec);
  std::string item;
  while (std::getline(ss, item, '@')) {
    item = trim(item);
    if (item.empty()) throw std::invalid_argument("resource filter '" + spec + "' has an empty entry");
    const size_t colon = item.find(':');
    std::vector<int> slots;
    if (colon != std::string::npos) {
      std::stringstream ls(item.substr(colon + 1));
      for (std::string n; std::getline(ls, n, ',');) slots.push_back(parseIndex(trim(n), "'" + item + "'"));
    }
    out.emplace_back(item.substr(0, colon), slots);
  }
  return out;
}

const HostSlots& find(const std::vector<HostSlots>& hosts, const std::string& name, const std::string& spec) {
  for (const auto& h : hosts)
    if (h.host == name) return h;
  throw std::invalid_argument("resource filter '" + spec + "' names host '" + name + "', which the host list lacks");
}

void checkSlots(const HostSlots& h, const std::vector<int>& slots) {
  for (int s : slots)
    if (s >= h.slots)
      throw std::invalid_argument("host '" + h.host + "' has " + std::to_string(h.slots) + " slots; slot " +
                                  std::to_string(s) + " does not exist");
}
}  // namespace

std::vector<HostSlots> includeHosts(const std::vector<HostSlots>& hosts, const std::string& spec) {
  std::vector<HostSlots> out;
  try {
    for (const auto& [name, slots] : parseFilter(spec)) {
      const HostSlots& h = find(hosts, name, spec);
      checkSlots(h, slots);
      out.push_back({name, slots.empty() ? h.slots : static_cast<int>(std::set<int>(slots.begin(), slots.end()).size())});
    }
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(std::string("--include: ") + e.what());
  }
  return out;
}

std::vector<HostSlots> excludeHosts(const std::vector<HostSlots>& hosts, const std::string& spec) {
  std::vector<HostSlots> out = hosts;
  try {
    for (const auto& [name, slots] : parseFilter(spec)) {
      const HostSlots& h = find(hosts, name, spec);
      checkSlots(h, slots);
      for (auto& o : out)
        if (o.host == name) o.slots = slots.empty() ? 0 : h.slots - static_cast<int>(std::set<int>(slots.begin(), slots.end()).size());
    }
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(std::string("--exclude: ") + e.what());
  }
  out.erase(std::remove_if(out.begin(), out.end(), [](const HostSlots& h) { return h.slots <= 0; }), out.end());
  return out;
}

}  // namespace chorus::launcher
