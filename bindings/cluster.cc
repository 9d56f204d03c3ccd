// chorus._core's pieces for starting jobs from cluster engines (chorus.spark,
// chorus.ray): a held port for rank 0's store, a job secret, and the store's
// server and client, so that a driver hears of its tasks without trusting strangers.
#include <chrono>
#include <memory>
#include <string>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "chorus/store.h"
#include "rendezvous/elastic_rounds.h"
#include "base/net_address.h"

namespace py = pybind11;
using namespace chorus;

namespace {

std::chrono::milliseconds ms(double seconds) { return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000)); }

struct PyStoreServer {
  std::unique_ptr<TcpStoreServer> server;
  int port() const {
    if (!server) throw py::value_error("the store server is closed");
    return server->port();
  }
  void close() {
    py::gil_scoped_release release;
    server.reset();
  }
};

py::bytes asBytes(const std::vector<char>& v) { return py::bytes(v.data(), v.size()); }

// The elastic driver's workers as Python callables (chorus.ray's actors, Spark task
// slots). step() runs without the interpreter lock (it waits on the store); each
// callback takes it. A callback's Exception becomes std::runtime_error, which the
// driver reports as a discovery or start failure; KeyboardInterrupt and SystemExit
// stay Python's and end step() with them.
class PyPool : public elastic::WorkerPool {
 public:
  PyPool(py::object discover, py::object start, py::object stop, py::object stopAll, py::object log)
      : discover_(std::move(discover)), start_(std::move(start)), stop_(std::move(stop)),
        stopAll_(std::move(stopAll)), log_(std::move(log)) {}
  ~PyPool() override {
    py::gil_scoped_acquire gil;
    discover_ = start_ = stop_ = stopAll_ = log_ = py::object();
  }
  std::vector<elastic::Host> discover() override {
    return call([&] {
      std::vector<elastic::Host> out;
      for (const auto& [host, slots] : discover_().cast<std::vector<std::pair<std::string, int>>>())
        out.push_back({host, slots});
      return out;
    });
  }
  int start(const std::string& id, const std::string& host, int slot,
            const std::map<std::string, std::string>& env) override {
    return call([&] { return start_(id, host, slot, env).cast<int>(); });
  }
  void stop(int handle) override {
    call([&] { return stop_(handle); });
  }
  void stopAll() override {
    call([&] { return stopAll_(); });
  }
  void log(const std::string& line) override {
    py::gil_scoped_acquire gil;
    if (log_.is_none()) return WorkerPool::log(line);
    log_(line);
  }

 private:
  template <typename F>
  auto call(F f) -> decltype(f()) {
    py::gil_scoped_acquire gil;
    try {
      return f();
    } catch (py::error_already_set& e) {
      if (!e.matches(PyExc_Exception)) throw;  // KeyboardInterrupt, SystemExit
      throw std::runtime_error(e.what());
    } catch (const py::cast_error& e) {
      throw std::runtime_error(std::string("a callback returned the wrong type: ") + e.what());
    }
  }

  py::object discover_, start_, stop_, stopAll_, log_;
};

// The pool lives as long as the driver that calls it.
struct PyElasticDriver {
  std::unique_ptr<PyPool> pool;
  std::unique_ptr<elastic::Driver> driver;
  PyElasticDriver() = default;
  PyElasticDriver(PyElasticDriver&&) = default;
  PyElasticDriver& operator=(PyElasticDriver&&) = default;
  ~PyElasticDriver() {
    // Python destroys this object holding the lock; the driver's store thread does not need it.
    driver.reset();
    pool.reset();
  }
};

elastic::Driver& live(PyElasticDriver& d) {
  if (!d.driver) throw py::value_error("the elastic driver is closed");
  return *d.driver;
}

}  // namespace

void bindCluster(py::module_& m) {
  py::class_<net::HeldPort>(m, "HeldPort", "A free TCP port kept from other programs until released (net::HeldPort).")
      .def_property_readonly("port", &net::HeldPort::port)
      .def_property_readonly("held", &net::HeldPort::held)
      .def("release", &net::HeldPort::release);
  m.def("hold_free_port", [] { return net::holdFreePort(); },
        "A free port outside the ephemeral range, held (bound, never listening) until released; a "
        "server that sets SO_REUSEADDR, as chorus's store does, can listen on it meanwhile.");
  m.def("generate_secret", [] { return generateSecret(); });

  py::class_<PyStoreServer>(m, "StoreServer", "chorus's TCP store server (authenticated by the secret).")
      .def(py::init([](const std::string& bind, int port, const std::string& secret) {
             if (secret.empty()) throw py::value_error("StoreServer: the secret is empty");
             py::gil_scoped_release release;
             return PyStoreServer{startTcpStoreServer(bind, port, secret)};
           }),
           py::arg("bind") = "0.0.0.0", py::arg("port") = 0, py::arg("secret"))
      .def_property_readonly("port", &PyStoreServer::port)
      .def("close", &PyStoreServer::close);

  py::class_<PyElasticDriver>(m, "ElasticDriver",
                              "The elastic driver chorusrun runs (src/rendezvous/elastic_rounds.h), with workers "
                              "that Python starts and stops.")
      .def(py::init([](py::object discover, py::object start, py::object stop, py::object stopAll, int minNp,
                       int maxNp, int initialNp, int resetLimit, double cooldownMin, double cooldownMax,
                       double elasticTimeout, int blacklistAfter, double discoveryInterval, const std::string& bind,
                       const std::string& advertised, int port, const std::string& name, py::object log,
                       std::map<std::string, std::string> words) {
             elastic::Options o;
             o.minNp = minNp;
             o.maxNp = maxNp;
             o.initialNp = initialNp;
             o.resetLimit = resetLimit;
             o.cooldownMin = cooldownMin;
             o.cooldownMax = cooldownMax;
             o.elasticTimeout = elasticTimeout;
             o.blacklistAfter = blacklistAfter;
             o.discoveryInterval = discoveryInterval;
             o.name = name;
             if (words.count("min_np")) o.minNpWord = words["min_np"];
             if (words.count("reset_limit")) o.resetLimitWord = words["reset_limit"];
             if (words.count("elastic_timeout")) o.timeoutWord = words["elastic_timeout"];
             if (words.count("blacklist_after")) o.blacklistWord = words["blacklist_after"];
             PyElasticDriver d;
             d.pool = std::make_unique<PyPool>(discover, start, stop, stopAll, log);
             py::gil_scoped_release release;  // the store's start and first connection
             d.driver = std::make_unique<elastic::Driver>(o, *d.pool, bind, advertised, port);
             return d;
           }),
           py::arg("discover"), py::arg("start"), py::arg("stop"), py::arg("stop_all"), py::arg("min_np") = 1,
           py::arg("max_np") = 0, py::arg("initial_np") = 0, py::arg("reset_limit") = -1,
           py::arg("cooldown_min") = 0.0, py::arg("cooldown_max") = 0.0, py::arg("elastic_timeout") = 600.0,
           py::arg("blacklist_after") = 3, py::arg("discovery_interval") = 1.0, py::arg("bind") = "0.0.0.0",
           py::arg("advertised") = "127.0.0.1", py::arg("port") = 0, py::arg("name") = "chorus elastic",
           py::arg("log") = py::none(), py::arg("words") = std::map<std::string, std::string>{})
      .def_property_readonly("store_addr", [](PyElasticDriver& d) { return live(d).storeAddr(); })
      .def_property_readonly("store_port", [](PyElasticDriver& d) { return live(d).storePort(); })
      .def_property_readonly("secret", [](PyElasticDriver& d) { return live(d).secret(); })
      .def_property_readonly("hosts", [](PyElasticDriver& d) { return live(d).hosts(); })
      .def_property_readonly("failure", [](PyElasticDriver& d) { return live(d).failure(); })
      .def("store_environment", [](PyElasticDriver& d) { return live(d).storeEnvironment(); })
      .def("begin",
           [](PyElasticDriver& d) {
             py::gil_scoped_release release;
             live(d).begin();
           })
      .def("step",
           [](PyElasticDriver& d, const std::vector<std::tuple<int, bool, std::string>>& ended) {
             std::vector<elastic::WorkerEnd> e;
             for (const auto& [handle, ok, what] : ended) e.push_back({handle, ok, what, false});
             py::gil_scoped_release release;
             return live(d).step(e);
           },
           "Worker ends as (handle, ok, what); returns the job's exit code once it is over, else None.")
      .def("abort",
           [](PyElasticDriver& d, const std::string& why) {
             py::gil_scoped_release release;
             return live(d).abort(why);
           })
      .def("close",
           [](PyElasticDriver& d) {
             py::gil_scoped_release release;  // the pool's destructor takes it back
             d.driver.reset();
             d.pool.reset();
           },
           "Stops the driver's store and lets go of the callables.");

  py::class_<Store, std::shared_ptr<Store>>(m, "StoreClient", "A client of chorus's TCP store.")
      .def(py::init([](const std::string& host, int port, const std::string& secret, double timeout) {
             py::gil_scoped_release release;
             return connectTcpStore(host, port, secret, ms(timeout));
           }),
           py::arg("host"), py::arg("port"), py::arg("secret"), py::arg("timeout") = 30.0)
      .def("set", [](Store& s, const std::string& key, const std::string& value) {
             py::gil_scoped_release release;
             s.set(key, std::vector<char>(value.begin(), value.end()));
           })
      .def("get", [](Store& s, const std::string& key, double timeout) {
             std::vector<char> v;
             {
               py::gil_scoped_release release;
               v = s.get(key, ms(timeout));
             }
             return asBytes(v);
           }, py::arg("key"), py::arg("timeout") = 30.0)
      .def("add", [](Store& s, const std::string& key, int64_t delta) {
             py::gil_scoped_release release;
             return s.add(key, delta);
           })
      .def("check", [](Store& s, const std::string& key) {
             py::gil_scoped_release release;
             return s.check(key);
           });
}
