#pragma once
// The checkpoint container: a JSON header and named binary blobs, with a hash
// of everything in a trailer so that a truncated or altered file is refused by
// name. Written atomically (temporary file, fsync, rename, fsync of the folder).
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace chorus::zero {

struct ShardFile {
  std::string meta;                                // JSON text
  std::map<std::string, std::string> blobs;        // name -> bytes

  void write(const std::string& path) const;
  // Throws chorus::Error naming the path when the file is missing, truncated or corrupted.
  static ShardFile read(const std::string& path);
  // Only the meta (the header at the file's start; the body is checked by read()).
  static std::string readMeta(const std::string& path);
};

// Writes bytes to path atomically.
void writeFileAtomic(const std::string& path, const std::string& bytes);
std::string readFile(const std::string& path);

// 64-bit hash over a byte string (four independent lanes, fast enough for GBs).
uint64_t contentHash(const void* data, size_t n);

}  // namespace chorus::zero
