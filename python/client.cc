// The `tessera` Python module: the Client (ps/client/client.h) and its Futures, and the
// Client's data calls: tables, sparse pull and push, dense pull and push. Its clocks, metadata
// and admin calls are in client_admin.cc.
#include "ps/client/client.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "ps/coord/coordinator_url.h"
#include "ps/coord/etcd_map_source.h"
#include "ps/routing.h"
#include "ps/status.h"
#include "ps/table_spec.h"
#include "python/module_internal.h"

namespace tessera::python {

void WaitOrRaise(Client& c, const Handle& h, std::optional<int64_t> timeout_ms) {
  Status s;
  {
    py::gil_scoped_release nogil;
    s = c.Wait(h, DeadlineOf(timeout_ms));
    // A timed-out call still owns its output buffer; cancel it so the array may be freed.
    if (s.code() == StatusCode::kDeadlineExceeded) c.Cancel(h);
  }
  Check(s);
}

namespace {

// "host:port" is "tcp://host:port": Python callers rarely spell the transport. The list then
// goes through ParseClusterList, so it is checked as the binaries check --cluster ("@FILE"
// lists are taken as written).
std::vector<std::string> ParseEndpoints(const py::object& cluster) {
  std::vector<std::string> items;
  if (py::isinstance<py::str>(cluster)) {
    const std::string text = cluster.cast<std::string>();
    if (!text.empty() && text[0] == '@') return Take(ParseClusterList(text));
    std::istringstream in(text);
    std::string item;
    while (std::getline(in, item, ',')) items.push_back(item);
  } else {
    items = cluster.cast<std::vector<std::string>>();
  }
  std::string spec;
  for (std::string& e : items) {
    const size_t a = e.find_first_not_of(" \t");
    if (a == std::string::npos) continue;
    e = e.substr(a, e.find_last_not_of(" \t") - a + 1);
    if (e.find("://") == std::string::npos) e = "tcp://" + e;
    spec += (spec.empty() ? "" : ",") + e;
  }
  return Take(ParseClusterList(spec));
}

// An asynchronous call: keeps the client and the output array alive until the call is final.
// Dropping an unfinished Future cancels the call, so nothing writes into freed memory.
class Future {
 public:
  Future(std::shared_ptr<Client> client, Handle h, py::object result)
      : client_(std::move(client)), handle_(std::move(h)), result_(std::move(result)) {}
  ~Future() {
    if (!final_ && client_) {
      py::gil_scoped_release nogil;
      client_->Cancel(handle_);
    }
  }
  Future(const Future&) = delete;
  Future& operator=(const Future&) = delete;

  // Waits (GIL released); returns the output array of a pull, else None. A timeout raises
  // DeadlineExceededError and leaves the call in flight (wait again, or cancel()).
  py::object Wait(std::optional<int64_t> timeout_ms) {
    if (!final_) {
      Status s;
      {
        py::gil_scoped_release nogil;
        s = client_->Wait(handle_, DeadlineOf(timeout_ms));
      }
      if (s.code() == StatusCode::kDeadlineExceeded) Raise(s);
      final_ = true;
      status_ = s;
    }
    Check(status_);
    return result_;
  }
  // Whether the call is final (Wait would not block).
  bool Done() {
    if (final_) return true;
    Status s;
    {
      py::gil_scoped_release nogil;
      s = client_->Wait(handle_, Clock::now());
    }
    if (s.code() == StatusCode::kDeadlineExceeded) return false;
    final_ = true;
    status_ = s;
    return true;
  }
  void Cancel() {
    if (final_) return;
    py::gil_scoped_release nogil;
    client_->Cancel(handle_);
  }

 private:
  std::shared_ptr<Client> client_;
  Handle handle_;
  py::object result_;
  bool final_ = false;
  Status status_;
};

void CheckSparse(const Table& t) {
  if (t.spec.kind != TableKind::kSparse) {
    Raise(Status::InvalidArgument("table '" + t.spec.name + "' is not a sparse table"));
  }
}
void CheckDense(const Table& t) {
  if (t.spec.kind != TableKind::kDense) {
    Raise(Status::InvalidArgument("table '" + t.spec.name + "' is not a dense table"));
  }
}

// The table argument of a data call: a Table, or a name looked up on the servers.
Table TableOf(Client& c, const py::handle& table) {
  if (py::isinstance<Table>(table)) return table.cast<Table>();
  if (py::isinstance<py::str>(table)) {
    const std::string name = table.cast<std::string>();
    Result<Table> t = [&] {
      py::gil_scoped_release nogil;
      return c.GetTable(name);
    }();
    return Take(std::move(t));
  }
  throw py::type_error("table: expected a tessera.Table or a table name");
}

// Issues a sparse pull into `out` (checked or allocated); returns the handle and the array.
std::pair<Handle, py::array> StartPull(Client& c, const Table& t, const Keys& keys,
                                       const std::optional<py::object>& out) {
  CheckSparse(t);
  py::array a = OutRows(out, keys, t.spec.dim);
  float* dst = MutableFloats(a);
  Handle h;
  {
    py::gil_scoped_release nogil;
    h = c.Pull(t, keys.span, dst);
  }
  return {std::move(h), std::move(a)};
}

Handle StartPush(Client& c, const Table& t, const Keys& keys, const py::array& grads) {
  CheckSparse(t);
  CheckRowsShape(grads, keys.shape, keys.span.size(), t.spec.dim, "grads");
  py::gil_scoped_release nogil;  // the client copies keys and grads before Push returns
  return c.Push(t, keys.span, Floats(grads));
}

// Construction (from a cluster list or an etcd:// URL), close(), context manager,
// properties.
void RegisterClientSetup(py::class_<PyClient>& cls) {
  const ClientOptions co;
  cls.def(py::init([co](py::object cluster, uint32_t worker_id, uint32_t num_workers,
                        int32_t staleness, int64_t request_timeout_ms, int64_t retry_for_ms,
                        int64_t connect_timeout_ms, std::string curve_server_key,
                        std::string curve_client_secret_key, std::string admin_root) {
            ClientOptions o;
            // "etcd://HOST:PORT/PREFIX": the cluster map in etcd names the servers.
            std::optional<CoordinatorUrl> coordinator;
            if (py::isinstance<py::str>(cluster) &&
                cluster.cast<std::string>().rfind("etcd://", 0) == 0) {
              coordinator = Take(CoordinatorUrl::Parse(cluster.cast<std::string>()));
            } else {
              o.servers = ParseEndpoints(cluster);
            }
            o.worker_id = worker_id;
            o.consistency.num_workers = num_workers;
            o.consistency.staleness = staleness;
            o.request_timeout_ms = request_timeout_ms;
            o.retry_for_ms = retry_for_ms;
            o.connect_timeout_ms = connect_timeout_ms;
            o.curve_server_key = std::move(curve_server_key);
            // This client's own key pair (Z85 secret key): a key in the servers'
            // --admin_clients may checkpoint, restore and export; empty: a fresh key.
            o.curve_client_secret_key = std::move(curve_client_secret_key);
            o.admin_root = std::move(admin_root);
            Result<std::unique_ptr<Client>> c = [&]() -> Result<std::unique_ptr<Client>> {
              py::gil_scoped_release nogil;
              if (!coordinator) return Client::Create(o);
              TESSERA_ASSIGN_OR_RETURN(auto source, EtcdClusterMapSource::Create(*coordinator));
              return Client::Create(o, std::move(source));
            }();
            return std::make_unique<PyClient>(std::shared_ptr<Client>(Take(std::move(c))));
          }),
          py::arg("cluster"), py::kw_only(), py::arg("worker_id") = co.worker_id,
          py::arg("num_workers") = co.consistency.num_workers,
          py::arg("staleness") = co.consistency.staleness,
          py::arg("request_timeout_ms") = co.request_timeout_ms,
          py::arg("retry_for_ms") = co.retry_for_ms,
          py::arg("connect_timeout_ms") = co.connect_timeout_ms,
          py::arg("curve_server_key") = co.curve_server_key,
          py::arg("curve_client_secret_key") = co.curve_client_secret_key,
          py::arg("admin_root") = co.admin_root)
      .def("close", &PyClient::Close,
           "Drops the connection (after calls still waiting in other threads end).")
      .def_property_readonly("closed", &PyClient::closed)
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyClient& c, py::args) { c.Close(); })
      .def_property_readonly("num_servers",
                             [](const PyClient& c) { return c.Get()->num_servers(); })
      .def_property_readonly("servers",
                             [](const PyClient& c) { return c.Get()->options().servers; })
      .def_property_readonly("worker_id",
                             [](const PyClient& c) { return c.Get()->options().worker_id; })
      .def_property_readonly(
          "cluster_map_version", [](const PyClient& c) { return c.Get()->cluster_map_version(); },
          "The cluster map version calls are routed by (0: a static cluster).")
      .def_property_readonly(
          "stale_map_retries", [](const PyClient& c) { return c.Get()->stale_map_retries(); },
          "Requests sent again after a server refused them as routed by an older map.");
}

// Tables.
void RegisterClientTables(py::class_<PyClient>& cls) {
  cls.def(
         "create_table",
         [](PyClient& self, const TableSpec& spec, std::optional<int64_t> timeout_ms) {
           auto c = self.Get();
           Result<Table> t = [&] {
             py::gil_scoped_release nogil;
             return c->CreateTable(spec, DeadlineOf(timeout_ms));
           }();
           return Take(std::move(t));
         },
         py::arg("spec"), py::arg("timeout_ms") = py::none(),
         "Creates the table on every server (same spec again: OK; another spec: "
         "AlreadyExistsError naming the differences).")
      .def(
          "get_table",
          [](PyClient& self, const std::string& name, std::optional<int64_t> timeout_ms) {
            auto c = self.Get();
            Result<Table> t = [&] {
              py::gil_scoped_release nogil;
              return c->GetTable(name, DeadlineOf(timeout_ms));
            }();
            return Take(std::move(t));
          },
          py::arg("name"), py::arg("timeout_ms") = py::none(),
          "An existing table by name (NotFoundError if there is none).")
      .def(
          "drop_table",
          [](PyClient& self, const std::string& name, std::optional<int64_t> timeout_ms) {
            auto c = self.Get();
            Status s = [&] {
              py::gil_scoped_release nogil;
              return c->DropTable(name, DeadlineOf(timeout_ms));
            }();
            Check(s);
          },
          py::arg("name"), py::arg("timeout_ms") = py::none(),
          "Drops the table on every server: its rows leave memory and disk, and a table "
          "created again under the name starts empty (a name no server knows: no error). "
          "Needs the admin right.");
}

// Sparse data: pulls.
void RegisterClientPull(py::class_<PyClient>& cls) {
  cls.def(
         "pull",
         [](PyClient& self, py::handle table, py::handle keys, std::optional<py::object> out,
            std::optional<int64_t> timeout_ms) {
           auto c = self.Get();
           const Table t = TableOf(*c, table);
           const Keys k = AsKeys(keys);
           auto [h, a] = StartPull(*c, t, k, out);
           WaitOrRaise(*c, h, timeout_ms);
           return a;
         },
         py::arg("table"), py::arg("keys"), py::arg("out") = py::none(),
         py::arg("timeout_ms") = py::none(),
         "Rows of `keys` (shape keys.shape + (dim,)); with out=, written into that float32 "
         "C-contiguous array in place and returned.")
      .def(
          "pull_async",
          [](PyClient& self, py::handle table, py::handle keys, std::optional<py::object> out) {
            auto c = self.Get();
            const Table t = TableOf(*c, table);
            const Keys k = AsKeys(keys);
            auto [h, a] = StartPull(*c, t, k, out);
            return std::make_unique<Future>(c, h, a);
          },
          py::arg("table"), py::arg("keys"), py::arg("out") = py::none(),
          "As pull, but returns a Future at once; Future.wait() returns the array. The Future "
          "keeps the array alive; do not read or write it before wait() returns.");
}

// Sparse data: pushes.
void RegisterClientPush(py::class_<PyClient>& cls) {
  cls.def(
         "push",
         [](PyClient& self, py::handle table, py::handle keys, py::handle grads,
            std::optional<int64_t> timeout_ms) {
           auto c = self.Get();
           const Table t = TableOf(*c, table);
           const Keys k = AsKeys(keys);
           const py::array g = AsGrads(grads, "grads");
           WaitOrRaise(*c, StartPush(*c, t, k, g), timeout_ms);
         },
         py::arg("table"), py::arg("keys"), py::arg("grads"), py::arg("timeout_ms") = py::none(),
         "Applies the table's optimizer to the gradients of `keys` (duplicate keys' gradients "
         "are summed).")
      .def(
          "push_async",
          [](PyClient& self, py::handle table, py::handle keys, py::handle grads) {
            auto c = self.Get();
            const Table t = TableOf(*c, table);
            const Keys k = AsKeys(keys);
            const py::array g = AsGrads(grads, "grads");
            // Keys and gradients are copied before Push returns: the Future holds no arrays.
            return std::make_unique<Future>(c, StartPush(*c, t, k, g), py::none());
          },
          py::arg("table"), py::arg("keys"), py::arg("grads"),
          "As push, but returns a Future at once. The arrays may be reused immediately.")
      .def(
          "push_pull",
          [](PyClient& self, py::handle table, py::handle keys, py::handle grads,
             std::optional<py::object> out, std::optional<int64_t> timeout_ms) {
            auto c = self.Get();
            const Table t = TableOf(*c, table);
            CheckSparse(t);
            const Keys k = AsKeys(keys);
            const py::array g = AsGrads(grads, "grads");
            CheckRowsShape(g, k.shape, k.span.size(), t.spec.dim, "grads");
            py::array a = OutRows(out, k, t.spec.dim);
            float* dst = MutableFloats(a);
            Handle h;
            {
              py::gil_scoped_release nogil;
              h = c->PushPull(t, k.span, Floats(g), dst);
            }
            WaitOrRaise(*c, h, timeout_ms);
            return a;
          },
          py::arg("table"), py::arg("keys"), py::arg("grads"), py::arg("out") = py::none(),
          py::arg("timeout_ms") = py::none(),
          "Push, then the rows after the push, in one round trip.");
}

// Dense data.
void RegisterClientDense(py::class_<PyClient>& cls) {
  cls.def(
         "dense_pull",
         [](PyClient& self, py::handle table, uint64_t offset, std::optional<uint64_t> length,
            std::optional<py::object> out, std::optional<int64_t> timeout_ms) {
           auto c = self.Get();
           const Table t = TableOf(*c, table);
           CheckDense(t);
           auto [off, len] = DenseRange(t.spec, offset, length);
           py::array a = OutDense(out, len);
           float* dst = MutableFloats(a);
           Handle h;
           {
             py::gil_scoped_release nogil;
             h = c->DensePull(t, off, len, dst);
           }
           WaitOrRaise(*c, h, timeout_ms);
           return a;
         },
         py::arg("table"), py::arg("offset") = 0, py::arg("length") = py::none(),
         py::arg("out") = py::none(), py::arg("timeout_ms") = py::none(),
         "Elements [offset, offset + length) (default: to the end) as a 1-D float32 array.")
      .def(
          "dense_push",
          [](PyClient& self, py::handle table, py::handle grads, uint64_t offset,
             std::optional<int64_t> timeout_ms) {
            auto c = self.Get();
            const Table t = TableOf(*c, table);
            CheckDense(t);
            const py::array g = AsGrads(grads, "grads");
            Handle h;
            {
              py::gil_scoped_release nogil;
              h = c->DensePush(t, offset, Floats(g));
            }
            WaitOrRaise(*c, h, timeout_ms);
          },
          py::arg("table"), py::arg("grads"), py::arg("offset") = 0,
          py::arg("timeout_ms") = py::none(),
          "Gradients of elements [offset, offset + grads.size) (any shape, flattened).");
}

}  // namespace

void RegisterClient(py::module_& m) {
  py::class_<Future>(m, "Future",
                     "An asynchronous call. wait() returns the output array of a pull (else "
                     "None) or raises; dropping an unfinished Future cancels the call.")
      .def("wait", &Future::Wait, py::arg("timeout_ms") = py::none())
      .def("done", &Future::Done)
      .def("cancel", &Future::Cancel);

  py::class_<PyClient> cls(
      m, "Client",
      "A connection to a Tessera cluster (ps/client/client.h). Thread-safe: "
      "several Python threads may call it at once; every wait releases the GIL.");
  RegisterClientSetup(cls);
  RegisterClientTables(cls);
  RegisterClientPull(cls);
  RegisterClientPush(cls);
  RegisterClientDense(cls);
  RegisterClientClocks(cls);
  RegisterClientMeta(cls);
  RegisterClientAdmin(cls);
}

}  // namespace tessera::python
