#pragma once
// The checkpoint container: a JSON header and named binary blobs, with a hash
// of everything in a trailer so that a truncated or altered file is refused by
// name. Written atomically (temporary file, fsync, rename, fsync of the folder).
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace chorus::zero {

struct ShardFile {
  std::string meta;                                // JSON text
  std::map<std::string, std::string> blobs;        // name -> bytes
  // Blobs written by a producer a piece at a time (put(data, n) until `bytes` are out): state
  // that is not in memory whole (the optimizer's state on disk).
  using Put = std::function<void(const void* data, size_t n)>;
  struct Streamed {
    size_t bytes;
    std::function<void(const Put&)> produce;
  };
  std::map<std::string, Streamed> streamed;

  void write(const std::string& path) const;
  // Throws chorus::Error naming the path when the file is missing, truncated or corrupted.
  static ShardFile read(const std::string& path);
  // Only the meta (the header at the file's start; the body is checked by read()).
  static std::string readMeta(const std::string& path);
};

// A checkpoint file checked whole (its hash, read a piece at a time) and then read by
// ranges: never in memory whole. Throws as ShardFile::read does.
class ShardReader {
 public:
  explicit ShardReader(const std::string& path);
  ~ShardReader();
  ShardReader(const ShardReader&) = delete;
  ShardReader& operator=(const ShardReader&) = delete;
  const std::string& meta() const { return meta_; }
  // Bytes of blob `name`, or -1 when the file has none.
  int64_t size(const std::string& name) const;
  void read(const std::string& name, size_t offset, void* dst, size_t bytes) const;

 private:
  std::string path_, meta_;
  int fd_ = -1;
  std::map<std::string, std::pair<size_t, size_t>> index_;  // name -> (file offset, bytes)
};

// Writes bytes to path atomically.
void writeFileAtomic(const std::string& path, const std::string& bytes);
std::string readFile(const std::string& path);

// 64-bit hash over a byte string (four independent lanes, fast enough for GBs).
uint64_t contentHash(const void* data, size_t n);

}  // namespace chorus::zero
