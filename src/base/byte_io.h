#pragma once
// Little-endian byte writer/reader for control messages and the store protocol.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "chorus/error.h"

namespace chorus {

class ByteWriter {
 public:
  template <typename T>
  void put(T v) {
    static_assert(std::is_trivially_copyable_v<T>);
    append(&v, sizeof(T));
  }
  void putString(const std::string& s) {
    put<uint32_t>(static_cast<uint32_t>(s.size()));
    append(s.data(), s.size());
  }
  void putBytes(const std::vector<char>& b) {
    put<uint32_t>(static_cast<uint32_t>(b.size()));
    append(b.data(), b.size());
  }
  template <typename T>
  void putVector(const std::vector<T>& v) {
    put<uint32_t>(static_cast<uint32_t>(v.size()));
    for (const T& x : v) put<T>(x);
  }
  std::vector<char>& data() { return buf_; }

 private:
  void append(const void* p, size_t n) {
    const size_t old = buf_.size();
    buf_.resize(old + n);
    if (n) std::memcpy(buf_.data() + old, p, n);
  }

  std::vector<char> buf_;
};

class ByteReader {
 public:
  ByteReader(const char* data, size_t size) : p_(data), end_(data + size) {}
  explicit ByteReader(const std::vector<char>& v) : ByteReader(v.data(), v.size()) {}

  template <typename T>
  T get() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, p_, sizeof(T));
    p_ += sizeof(T);
    return v;
  }
  std::string getString() {
    uint32_t n = get<uint32_t>();
    need(n);
    std::string s(p_, n);
    p_ += n;
    return s;
  }
  std::vector<char> getBytes() {
    uint32_t n = get<uint32_t>();
    need(n);
    std::vector<char> b(p_, p_ + n);
    p_ += n;
    return b;
  }
  template <typename T>
  std::vector<T> getVector() {
    uint32_t n = get<uint32_t>();
    std::vector<T> v;
    v.reserve(n);
    for (uint32_t i = 0; i < n; ++i) v.push_back(get<T>());
    return v;
  }
  bool done() const { return p_ == end_; }

 private:
  void need(size_t n) {
    if (static_cast<size_t>(end_ - p_) < n) throw Error("truncated control message");
  }
  const char* p_;
  const char* end_;
};

}  // namespace chorus
