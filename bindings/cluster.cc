// chorus._core's pieces for starting jobs from cluster engines (chorus.spark,
// chorus.ray): a held port for rank 0's store, a job secret, and the store's
// server and client, so that a driver hears of its tasks without trusting strangers.
#include <chrono>
#include <memory>
#include <string>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "chorus/store.h"
#include "rendezvous/net_address.h"

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
