#pragma once
// CHORUS_METRICS_PORT: a rank's statistics in Prometheus' text format over HTTP.
// One connection at a time, each with a small bounded read and a deadline: a
// stranger can hold it for at most a moment and make it allocate nothing.
#include <atomic>
#include <functional>
#include <string>
#include <thread>

#include "chorus/runtime.h"

namespace chorus {

class MetricsServer {
 public:
  // render: the page, made at each request. Throws Error when the port cannot be bound.
  MetricsServer(const std::string& bind, int port, std::function<std::string()> render);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;
  int port() const { return port_; }

 private:
  void loop();
  void serve(int fd);
  int listenFd_ = -1;
  int port_ = 0;
  std::function<std::string()> render_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// The Prometheus text of one rank's process sets (ids beside their statistics).
std::string prometheusText(int rank, int size, const std::vector<std::pair<int32_t, ProcessSetStats>>& sets);

}  // namespace chorus
