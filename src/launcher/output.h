#pragma once
// Ranks' output on chorusrun's terminal: passed on as it arrives, every line
// starting with its rank's tag ("[1]<stderr>:"); a line redrawn after '\r' (a
// progress bar) gets one tag per redraw, and a line left open by one stream is
// ended before another stream writes.
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <string>

namespace chorus::launcher {

// What a stream holds of a line not yet ended, at most (plus one read).
constexpr size_t kMaxPending = 64 * 1024;

struct Stream {
  int fd = -1;
  FILE* log = nullptr;  // --output-filename's file for this stream
  int rank = 0;         // the tag
  bool isErr = false;
  bool open = false;    // this stream's tag starts the terminal's current line
  bool redraw = false;  // a '\r' came: the next text redraws the line, tag first
  bool cut = false;     // another stream ended this one's line: its own newline is spent
  // The end of a line not yet ended: held a moment, so that one line written in
  // pieces (print() under python -u) is not cut by another rank's output; held
  // only up to kMaxPending bytes, then written out (the line stays open).
  std::string pending;
  std::chrono::steady_clock::time_point pendingSince;
};

// Reads what is available; returns false at end of file.
bool pump(Stream& s);
// Ends a line a stream left open, before chorusrun writes one of its own.
void endOpenLine();
// Forgets s as the holder of the open line (before s goes away).
void forgetStream(const Stream& s);

// dir/rank.N/name (N zero-padded to the digits of width - 1), directories made.
FILE* openLog(const std::string& dir, int rank, int width, const char* name);

}  // namespace chorus::launcher
