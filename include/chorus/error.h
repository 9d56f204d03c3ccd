#pragma once
// The one error policy: every failure is a chorus::Error subclass; background
// threads capture it and Work::wait() rethrows it on the caller's thread.
#include <stdexcept>
#include <string>

namespace chorus {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Bad input from the caller: wrong shape, unknown set, duplicate name...
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// The ranks agreed to refuse an op (allgather or broadcast while a rank has
// joined, a root outside the set): it fails on every rank that asked for it,
// and the runtime goes on. Python: a HorovodInternalError, as Horovod raises.
class Refused : public Error {
 public:
  using Error::Error;
};

// Ranks asked for the same tensor with different parameters.
class Mismatch : public Error {
 public:
  using Error::Error;
};

// A peer process died or its connection broke.
class PeerFailure : public Error {
 public:
  using Error::Error;
};

// A blocking wait ran past its deadline (a hung peer ends up here).
class Timeout : public PeerFailure {
 public:
  using PeerFailure::PeerFailure;
};

// The runtime (or the process set) was shut down while work was pending.
class ShutdownError : public Error {
 public:
  using Error::Error;
};

// The stall inspector gave up on tensors that some ranks never submitted.
class StallError : public Error {
 public:
  using Error::Error;
};

}  // namespace chorus
