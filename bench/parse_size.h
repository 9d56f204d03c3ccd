#pragma once
// "8", "64K", "16M", "1G" as bytes, for the benches' size options.
#include <cstddef>
#include <string>

#include "chorus/error.h"

namespace chorus::bench {

inline size_t parseSize(const std::string& s) {
  if (s.empty()) throw InvalidArgument("empty size");
  size_t used = 0;
  const double v = std::stod(s, &used);
  const std::string unit = s.substr(used);
  double mult = 1;
  if (unit == "K" || unit == "k") mult = 1024;
  else if (unit == "M" || unit == "m") mult = 1024.0 * 1024;
  else if (unit == "G" || unit == "g") mult = 1024.0 * 1024 * 1024;
  else if (!unit.empty()) throw InvalidArgument("size '" + s + "': unknown unit '" + unit + "' (use K, M or G)");
  return static_cast<size_t>(v * mult);
}

}  // namespace chorus::bench
