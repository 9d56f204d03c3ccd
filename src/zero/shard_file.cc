#include "zero/shard_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

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

}  // namespace

uint64_t contentHash(const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t lane[4] = {1, 2, 3, 4};
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    for (int k = 0; k < 4; ++k) {
      uint64_t v;
      std::memcpy(&v, p + i + 8 * k, 8);
      lane[k] = mix(lane[k], v);
    }
  }
  uint64_t h = mix(mix(lane[0], lane[1]), mix(lane[2], lane[3]));
  for (; i < n; ++i) h = mix(h, p[i]);
  return mix(h, n);
}

void writeFileAtomic(const std::string& path, const std::string& bytes) {
  const std::string tmp = path + ".tmp." + std::to_string(getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) sysFail("cannot create", tmp);
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ::close(fd);
      ::unlink(tmp.c_str());
      sysFail("cannot write", tmp);
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    ::unlink(tmp.c_str());
    sysFail("cannot flush", tmp);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    sysFail("cannot rename into", path);
  }
  syncParentDir(path);
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
  std::string body;
  for (const auto& [name, bytes] : blobs) {
    index[name] = {{"offset", body.size()}, {"bytes", bytes.size()}};
    body += bytes;
  }
  const std::string header = nlohmann::json{{"meta", meta}, {"blobs", index}}.dump();
  std::string out(kMagic, 8);
  appendU64(out, header.size());
  out += header;
  out += body;
  appendU64(out, contentHash(out.data(), out.size()));
  out.append(kEnd, 8);
  writeFileAtomic(path, out);
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
