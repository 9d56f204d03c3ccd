#include "core/metrics_server.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <sstream>

#include "chorus/error.h"

namespace chorus {

namespace {
constexpr size_t kMaxRequest = 4096;  // a GET line and a few headers; the rest is not read
constexpr int kDeadlineMs = 2000;
}  // namespace

MetricsServer::MetricsServer(const std::string& bind, int port, std::function<std::string()> render)
    : render_(std::move(render)) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  if (getaddrinfo(bind.c_str(), std::to_string(port).c_str(), &hints, &res) != 0)
    throw InvalidArgument("CHORUS_METRICS_BIND: cannot resolve '" + bind + "'");
  listenFd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int one = 1;
  setsockopt(listenFd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  const bool ok = listenFd_ >= 0 && ::bind(listenFd_, res->ai_addr, res->ai_addrlen) == 0 && ::listen(listenFd_, 16) == 0;
  const std::string why = std::strerror(errno);
  freeaddrinfo(res);
  if (!ok) {
    if (listenFd_ >= 0) ::close(listenFd_);
    throw Error("metrics: cannot listen on " + bind + ":" + std::to_string(port) + ": " + why +
                " (CHORUS_METRICS_PORT; each rank takes the port plus its local rank)");
  }
  sockaddr_in a{};
  socklen_t len = sizeof(a);
  getsockname(listenFd_, reinterpret_cast<sockaddr*>(&a), &len);
  port_ = ntohs(a.sin_port);
  thread_ = std::thread([this] { loop(); });
}

MetricsServer::~MetricsServer() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  ::close(listenFd_);
}

void MetricsServer::loop() {
  while (!stop_) {
    pollfd p{listenFd_, POLLIN, 0};
    if (::poll(&p, 1, 200) <= 0) continue;
    const int fd = ::accept4(listenFd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    serve(fd);
    ::close(fd);
  }
}

void MetricsServer::serve(int fd) {
  char buf[kMaxRequest];
  size_t got = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kDeadlineMs);
  while (got < sizeof(buf)) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    pollfd p{fd, POLLIN, 0};
    if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) return;  // too slow: dropped
    const ssize_t n = ::recv(fd, buf + got, sizeof(buf) - got, 0);
    if (n <= 0) return;
    got += static_cast<size_t>(n);
    if (std::string(buf, got).find("\r\n\r\n") != std::string::npos || std::string(buf, got).find("\n\n") != std::string::npos)
      break;
  }
  const std::string request(buf, got);
  std::string status = "200 OK", body;
  if (request.rfind("GET ", 0) != 0) {
    status = "405 Method Not Allowed";
    body = "only GET\n";
  } else {
    try {
      body = render_();
    } catch (const std::exception& e) {
      status = "503 Service Unavailable";
      body = std::string(e.what()) + "\n";
    }
  }
  const std::string reply = "HTTP/1.1 " + status + "\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: " +
                            std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
  size_t sent = 0;
  while (sent < reply.size()) {
    const ssize_t n = ::send(fd, reply.data() + sent, reply.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return;
    sent += static_cast<size_t>(n);
  }
}

namespace {
std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\\' || c == '"') out.push_back('\\');
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out.push_back(c);
  }
  return out;
}
}  // namespace

std::string prometheusText(int rank, int size, const std::vector<std::pair<int32_t, ProcessSetStats>>& sets) {
  std::ostringstream o;
  const std::string r = "rank=\"" + std::to_string(rank) + "\"";
  auto head = [&](const char* name, const char* type, const char* help) {
    o << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n';
  };
  head("chorus_world_size", "gauge", "Ranks in the job.");
  o << "chorus_world_size{" << r << "} " << size << '\n';
  struct PerOp {
    const char* name;
    const char* help;
    double (*value)(const OpStat&);
  };
  const PerOp perOp[] = {
      {"chorus_ops_total", "Collectives this rank ran, by process set, op and path.",
       [](const OpStat& s) { return static_cast<double>(s.count); }},
      {"chorus_op_tensors_total", "Tensors those collectives carried.",
       [](const OpStat& s) { return static_cast<double>(s.tensors); }},
      {"chorus_op_bytes_total", "Bytes those collectives carried.",
       [](const OpStat& s) { return static_cast<double>(s.bytes); }},
      {"chorus_op_seconds_total", "Seconds this rank spent running them.", [](const OpStat& s) { return s.seconds; }},
  };
  for (const auto& m : perOp) {
    head(m.name, "counter", m.help);
    for (const auto& [id, st] : sets)
      for (const OpStat& op : st.ops)
        o << m.name << '{' << r << ",process_set=\"" << id << "\",op=\"" << escape(op.op) << "\",path=\""
          << escape(op.path) << "\"} " << m.value(op) << '\n';
  }
  struct PerSet {
    const char* name;
    const char* type;
    const char* help;
    double (*value)(const ProcessSetStats&);
  };
  const PerSet perSet[] = {
      {"chorus_cycles_total", "counter", "Negotiation cycles run.",
       [](const ProcessSetStats& s) { return static_cast<double>(s.cycles); }},
      {"chorus_negotiated_ops_total", "counter", "Ops the coordinator decided.",
       [](const ProcessSetStats& s) { return static_cast<double>(s.negotiatedOps); }},
      {"chorus_cached_ops_total", "counter", "Ops served from the response cache.",
       [](const ProcessSetStats& s) { return static_cast<double>(s.cachedOps); }},
      {"chorus_payload_ops_total", "counter", "Small allreduces whose data went with the negotiation.",
       [](const ProcessSetStats& s) { return static_cast<double>(s.payloadOps); }},
      {"chorus_fusion_threshold_bytes", "gauge", "Fusion threshold in force (autotune changes it).",
       [](const ProcessSetStats& s) { return static_cast<double>(s.fusionThresholdBytes); }},
      {"chorus_cycle_time_seconds", "gauge", "Cycle time in force (autotune changes it).",
       [](const ProcessSetStats& s) { return s.cycleTimeMs / 1000.0; }},
  };
  for (const auto& m : perSet) {
    head(m.name, m.type, m.help);
    for (const auto& [id, st] : sets) o << m.name << '{' << r << ",process_set=\"" << id << "\"} " << m.value(st) << '\n';
  }
  return o.str();
}

}  // namespace chorus
