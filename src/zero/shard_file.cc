#include "zero/shard_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "chorus/error.h"
#include "base/sync_dir.h"

namespace chorus::zero {

namespace {

constexpr char kMagic[8] = {'C', 'H', 'O', 'R', 'U', 'S', 'Z', '1'};
constexpr char kEnd[8] = {'C', 'H', 'Z', 'E', 'N', 'D', '0', '1'};

uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v * 0x9E3779B97F4A7C15ull;
  h = (h << 31) | (h >> 33);
  return h * 0xBF58476D1CE4E5B9ull;
}

void appendU64(std::string& s, uint64_t v) { s.append(reinterpret_cast<const char*>(&v), 8); }

uint64_t readU64(const std::string& s, size_t at) {
  uint64_t v;
  std::memcpy(&v, s.data() + at, 8);
  return v;
}

[[noreturn]] void sysFail(const std::string& what, const std::string& path) {
  throw Error(what + " '" + path + "': " + std::strerror(errno));
}

// contentHash over data given in pieces: 32-byte blocks across the pieces' boundaries.
class StreamHash {
 public:
  void add(const void* data, size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    total_ += n;
    if (held_) {  // finish the block a previous piece began
      const size_t take = std::min(n, size_t{32} - held_);
      std::memcpy(block_ + held_, p, take);
      held_ += take;
      p += take;
      n -= take;
      if (held_ < 32) return;
      blockIn(block_);
      held_ = 0;
    }
    size_t i = 0;
    for (; i + 32 <= n; i += 32) blockIn(p + i);
    std::memcpy(block_, p + i, n - i);
    held_ = n - i;
  }
  uint64_t finish() const {
    uint64_t h = mix(mix(lane_[0], lane_[1]), mix(lane_[2], lane_[3]));
    for (size_t i = 0; i < held_; ++i) h = mix(h, block_[i]);
    return mix(h, total_);
  }

 private:
  void blockIn(const unsigned char* p) {
    for (int k = 0; k < 4; ++k) {
      uint64_t v;
      std::memcpy(&v, p + 8 * k, 8);
      lane_[k] = mix(lane_[k], v);
    }
  }
  uint64_t lane_[4] = {1, 2, 3, 4};
  unsigned char block_[32];
  size_t held_ = 0;
  uint64_t total_ = 0;
};

// A file written to a private name, flushed and renamed into place (then its folder synced).
class AtomicFile {
 public:
  explicit AtomicFile(const std::string& path) : path_(path), tmp_(path + ".tmp." + std::to_string(getpid())) {
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) sysFail("cannot create", tmp_);
  }
  ~AtomicFile() {
    if (fd_ >= 0) {
      ::close(fd_);
      ::unlink(tmp_.c_str());
    }
  }
  void write(const void* data, size_t size) {
    const auto* p = static_cast<const char*>(data);
    size_t done = 0;
    while (done < size) {
      const ssize_t n = ::write(fd_, p + done, size - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) sysFail("cannot write", tmp_);
      done += static_cast<size_t>(n);
    }
  }
  void commit() {
    const int fd = fd_;
    fd_ = -1;
    if (::fsync(fd) != 0) {
      ::close(fd);
      ::unlink(tmp_.c_str());
      sysFail("cannot flush", tmp_);
    }
    if (::close(fd) != 0) {
      ::unlink(tmp_.c_str());
      sysFail("cannot flush", tmp_);
    }
    if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
      ::unlink(tmp_.c_str());
      sysFail("cannot rename into", path_);
    }
    syncParentDir(path_);
  }

 private:
  std::string path_, tmp_;
  int fd_ = -1;
};

}  // namespace

uint64_t contentHash(const void* data, size_t n) {
  StreamHash h;
  h.add(data, n);
  return h.finish();
}

void writeFileAtomic(const std::string& path, const std::string& bytes) {
  AtomicFile f(path);
  f.write(bytes.data(), bytes.size());
  f.commit();
}

std::string readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) sysFail("cannot open", path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void ShardFile::write(const std::string& path) const {
  nlohmann::json index = nlohmann::json::object();
  size_t offset = 0;
  for (const auto& [name, bytes] : blobs) {
    index[name] = {{"offset", offset}, {"bytes", bytes.size()}};
    offset += bytes.size();
  }
  for (const auto& [name, s] : streamed) {
    if (blobs.count(name)) throw InvalidArgument("checkpoint file: blob '" + name + "' given twice");
    index[name] = {{"offset", offset}, {"bytes", s.bytes}};
    offset += s.bytes;
  }
  const std::string header = nlohmann::json{{"meta", meta}, {"blobs", index}}.dump();
  std::string head(kMagic, 8);
  appendU64(head, header.size());
  head += header;
  // Streamed: the header, then each blob as it lies in memory (no copy of the body), hashed on the way.
  AtomicFile file(path);
  StreamHash hash;
  file.write(head.data(), head.size());
  hash.add(head.data(), head.size());
  for (const auto& [name, bytes] : blobs) {
    file.write(bytes.data(), bytes.size());
    hash.add(bytes.data(), bytes.size());
  }
  for (const auto& [name, s] : streamed) {  // (a producer that fails or miscounts leaves no file)
    size_t got = 0;
    s.produce([&](const void* data, size_t n) {
      got += n;
      if (got > s.bytes) throw Error("checkpoint file '" + path + "': blob '" + name + "' overran its size");
      file.write(data, n);
      hash.add(data, n);
    });
    if (got != s.bytes)
      throw Error("checkpoint file '" + path + "': blob '" + name + "' gave " + std::to_string(got) + " of " +
                  std::to_string(s.bytes) + " bytes");
  }
  std::string tail;
  appendU64(tail, hash.finish());
  tail.append(kEnd, 8);
  file.write(tail.data(), tail.size());
  file.commit();
}

ShardFile ShardFile::read(const std::string& path) {
  const std::string s = readFile(path);
  auto bad = [&](const std::string& why) -> Error {
    return Error("checkpoint file '" + path + "' is " + why + "; it was not loaded");
  };
  if (s.size() < 32 || std::memcmp(s.data(), kMagic, 8) != 0) throw bad("not a chorus checkpoint file (bad magic)");
  if (std::memcmp(s.data() + s.size() - 8, kEnd, 8) != 0) throw bad("truncated (no end marker)");
  const size_t payload = s.size() - 16;
  if (readU64(s, payload) != contentHash(s.data(), payload)) throw bad("corrupted (content hash mismatch)");
  const uint64_t headerLen = readU64(s, 8);
  if (16 + headerLen > payload) throw bad("corrupted (header length out of range)");
  ShardFile f;
  try {
    auto header = nlohmann::json::parse(s.substr(16, headerLen));
    f.meta = header.at("meta").get<std::string>();
    const size_t base = 16 + headerLen;
    for (const auto& [name, where] : header.at("blobs").items()) {
      const size_t off = where.at("offset").get<size_t>(), n = where.at("bytes").get<size_t>();
      if (base + off + n > payload) throw bad("corrupted (blob '" + name + "' out of range)");
      f.blobs[name] = s.substr(base + off, n);
    }
  } catch (const nlohmann::json::exception& e) {
    throw bad(std::string("corrupted (header: ") + e.what() + ")");
  }
  return f;
}

ShardReader::ShardReader(const std::string& path) : path_(path) {
  auto bad = [&](const std::string& why) -> Error {
    return Error("checkpoint file '" + path + "' is " + why + "; it was not loaded");
  };
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw Error("checkpoint file '" + path + "' cannot be opened: " + std::strerror(errno));
  try {
    const off_t end = ::lseek(fd_, 0, SEEK_END);
    if (end < 32) throw bad("not a chorus checkpoint file (too short)");
    const size_t size = static_cast<size_t>(end), payload = size - 16;
    std::string head(16, '\0'), tail(16, '\0');
    read("", 0, head.data(), 16);
    read("", payload, tail.data(), 16);
    if (std::memcmp(head.data(), kMagic, 8) != 0) throw bad("not a chorus checkpoint file (bad magic)");
    if (std::memcmp(tail.data() + 8, kEnd, 8) != 0) throw bad("truncated (no end marker)");
    StreamHash hash;  // (the whole payload, 32 MiB at a time)
    std::vector<char> piece(std::min<size_t>(payload, size_t{32} << 20));
    for (size_t at = 0; at < payload; at += piece.size()) {
      const size_t n = std::min(piece.size(), payload - at);
      read("", at, piece.data(), n);
      hash.add(piece.data(), n);
    }
    if (readU64(tail, 0) != hash.finish()) throw bad("corrupted (content hash mismatch)");
    const uint64_t headerLen = readU64(head, 8);
    if (16 + headerLen > payload) throw bad("corrupted (header length out of range)");
    std::string header(headerLen, '\0');
    read("", 16, header.data(), headerLen);
    try {
      auto h = nlohmann::json::parse(header);
      meta_ = h.at("meta").get<std::string>();
      const size_t base = 16 + headerLen;
      for (const auto& [name, where] : h.at("blobs").items()) {
        const size_t off = where.at("offset").get<size_t>(), n = where.at("bytes").get<size_t>();
        if (off > payload - base || n > payload - base - off)
          throw bad("corrupted (blob '" + name + "' out of range)");
        index_[name] = {base + off, n};
      }
    } catch (const nlohmann::json::exception& e) {
      throw bad(std::string("corrupted (header: ") + e.what() + ")");
    }
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

ShardReader::~ShardReader() {
  if (fd_ >= 0) ::close(fd_);
}

int64_t ShardReader::size(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? -1 : static_cast<int64_t>(it->second.second);
}

void ShardReader::read(const std::string& name, size_t offset, void* dst, size_t bytes) const {
  size_t at = offset;  // ("": the file itself)
  if (!name.empty()) {
    auto it = index_.find(name);
    if (it == index_.end() || offset + bytes > it->second.second)
      throw Error("checkpoint file '" + path_ + "': no bytes [" + std::to_string(offset) + ", +" +
                  std::to_string(bytes) + ") in blob '" + name + "'");
    at = it->second.first + offset;
  }
  auto* p = static_cast<char*>(dst);
  for (size_t done = 0; done < bytes;) {
    const ssize_t n = ::pread(fd_, p + done, bytes - done, static_cast<off_t>(at + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw Error("checkpoint file '" + path_ + "' cannot be read: " + (n < 0 ? std::strerror(errno) : "truncated"));
    done += static_cast<size_t>(n);
  }
}

std::string ShardFile::readMeta(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  auto bad = [&](const std::string& why) -> Error {
    return Error("checkpoint file '" + path + "' is " + why + "; it was not loaded");
  };
  if (!in) throw Error("checkpoint file '" + path + "' cannot be opened: " + std::strerror(errno));
  std::string head(16, '\0');
  if (!in.read(head.data(), 16) || std::memcmp(head.data(), kMagic, 8) != 0)
    throw bad("not a chorus checkpoint file (bad magic)");
  const uint64_t headerLen = readU64(head, 8);
  if (headerLen > (64u << 20)) throw bad("corrupted (header length out of range)");
  std::string header(headerLen, '\0');
  if (!in.read(header.data(), static_cast<std::streamsize>(headerLen))) throw bad("truncated (in its header)");
  try {
    return nlohmann::json::parse(header).at("meta").get<std::string>();
  } catch (const nlohmann::json::exception& e) {
    throw bad(std::string("corrupted (header: ") + e.what() + ")");
  }
}

}  // namespace chorus::zero
