#pragma once
// The benches' --json output: written beside the target, then renamed over it,
// so that a reader never sees half a file.
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

namespace chorus::bench {

inline void writeJsonFile(const std::string& path, const nlohmann::json& value, int indent = 2) {
  const std::string tmp = path + ".tmp";
  std::ofstream(tmp) << value.dump(indent) << "\n";
  std::rename(tmp.c_str(), path.c_str());
}

}  // namespace chorus::bench
