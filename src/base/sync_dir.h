#pragma once
// After a rename into place: the directory entry survives a crash only once the
// directory itself is synced (best effort: a failure leaves the file renamed).
#include <fcntl.h>
#include <unistd.h>

#include <string>

namespace chorus {

inline void syncParentDir(const std::string& path) {
  const auto slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash + 1);
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace chorus
