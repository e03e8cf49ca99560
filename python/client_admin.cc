// The `tessera` Python module: the Client's calls besides data: clocks, learning-rate scale,
// barriers, metadata records, server stats, checkpoint, restore and export.
#include <charconv>
#include <cstdint>
#include <optional>
#include <sstream>
#include <string>
#include <system_error>
#include <utility>

#include "ps/client/client.h"
#include "ps/status.h"
#include "python/module_internal.h"

namespace tessera::python {
namespace {

py::object StatValue(const std::string& text) {
  int64_t i = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), i);
  if (ec == std::errc() && p == text.data() + text.size()) return py::int_(i);
  double d = 0;
  auto [q, ec2] = std::from_chars(text.data(), text.data() + text.size(), d);
  if (ec2 == std::errc() && q == text.data() + text.size()) return py::float_(d);
  return py::str(text);
}

}  // namespace

// Clocks, learning-rate scale, barriers.
void RegisterClientClocks(py::class_<PyClient>& cls) {
  cls.def(
         "clock",
         [](PyClient& self, std::optional<int64_t> timeout_ms) {
           auto c = self.Get();
           WaitOrRaise(*c, c->Clock(), timeout_ms);
           return c->clock();
         },
         py::arg("timeout_ms") = py::none(),
         "Ends this worker's step (advances its clock on every server); returns the new clock.")
      .def_property_readonly(
          "current_clock", [](const PyClient& c) { return c.Get()->clock(); },
          "This worker's clock (clock() calls, or the value of set_clock).")
      .def(
          "set_clock",
          [](PyClient& self, int64_t clock, std::optional<int64_t> timeout_ms) {
            auto c = self.Get();
            WaitOrRaise(*c, c->SetClock(clock), timeout_ms);
          },
          py::arg("clock"), py::arg("timeout_ms") = py::none())
      .def(
          "set_learning_rate_scale",
          [](PyClient& self, float scale) {
            Status s = self.Get()->SetLearningRateScale(scale);
            if (!s.ok()) Raise(s);
          },
          py::arg("scale"),
          "Pushes sent from now on have each table's learning rate multiplied by `scale` on the "
          "servers (a warm-up or decay factor; FTRL tables ignore it); in [0, 1000].")
      .def_property_readonly("learning_rate_scale",
                             [](const PyClient& c) { return c.Get()->learning_rate_scale(); })
      .def(
          "barrier",
          [](PyClient& self, const std::string& name, std::optional<int64_t> timeout_ms) {
            auto c = self.Get();
            Status s;
            {
              py::gil_scoped_release nogil;
              s = c->Barrier(name, DeadlineOf(timeout_ms));
            }
            Check(s);
          },
          py::arg("name"), py::arg("timeout_ms") = py::none(),
          "Blocks (GIL released) until num_workers workers called barrier(name).");
}

// Metadata records, stats.
void RegisterClientMeta(py::class_<PyClient>& cls) {
  cls.def(
         "put_meta",
         [](PyClient& self, const std::string& name, py::bytes value,
            std::optional<int64_t> timeout_ms) {
           auto c = self.Get();
           std::string v = value;
           Status s;
           {
             py::gil_scoped_release nogil;
             s = c->PutMeta(name, v, DeadlineOf(timeout_ms));
           }
           Check(s);
         },
         py::arg("name"), py::arg("value"), py::arg("timeout_ms") = py::none(),
         "Stores a small durable record on server 0 (bytes or str).")
      .def(
          "get_meta",
          [](PyClient& self, const std::string& name,
             std::optional<int64_t> timeout_ms) -> py::object {
            auto c = self.Get();
            Result<std::optional<std::string>> r = [&] {
              py::gil_scoped_release nogil;
              return c->GetMeta(name, DeadlineOf(timeout_ms));
            }();
            std::optional<std::string> v = Take(std::move(r));
            if (!v) return py::none();
            return py::bytes(*v);
          },
          py::arg("name"), py::arg("timeout_ms") = py::none(),
          "The record as bytes, or None when there is none.")
      .def(
          "server_stats",
          [](PyClient& self, uint32_t rank, std::optional<int64_t> timeout_ms) {
            auto c = self.Get();
            Result<std::string> r = [&] {
              py::gil_scoped_release nogil;
              return c->ServerStats(rank, DeadlineOf(timeout_ms));
            }();
            const std::string text = Take(std::move(r));
            py::dict d;
            std::istringstream in(text);
            std::string line;
            while (std::getline(in, line)) {
              const size_t sp = line.find(' ');
              if (sp == std::string::npos) continue;
              d[py::str(line.substr(0, sp))] = StatValue(line.substr(sp + 1));
            }
            return d;
          },
          py::arg("rank") = 0, py::arg("timeout_ms") = py::none(),
          "Server `rank`'s statistics as a dict (numbers where they parse as numbers).");
}

// Admin.
void RegisterClientAdmin(py::class_<PyClient>& cls) {
  cls.def(
         "checkpoint",
         [](PyClient& self, const std::string& dir, std::optional<int64_t> timeout_ms) {
           auto c = self.Get();
           Result<int64_t> r = [&] {
             py::gil_scoped_release nogil;
             return c->Checkpoint(dir, DeadlineOf(timeout_ms));
           }();
           return Take(std::move(r));
         },
         py::arg("dir"), py::arg("timeout_ms") = py::none(),
         "Consistent checkpoint of the cluster into `dir` (relative to admin_root); returns "
         "the cut clock.")
      .def(
          "restore",
          [](PyClient& self, const std::string& dir, std::optional<int64_t> timeout_ms) {
            auto c = self.Get();
            Status s;
            {
              py::gil_scoped_release nogil;
              s = c->Restore(dir, DeadlineOf(timeout_ms));
            }
            Check(s);
          },
          py::arg("dir"), py::arg("timeout_ms") = py::none())
      .def(
          "export",
          [](PyClient& self, const std::string& root, bool delta,
             std::optional<int64_t> timeout_ms) {
            auto c = self.Get();
            Result<uint64_t> r = [&] {
              py::gil_scoped_release nogil;
              return c->Export(root, delta, DeadlineOf(timeout_ms));
            }();
            return Take(std::move(r));
          },
          py::arg("root"), py::arg("delta") = false, py::arg("timeout_ms") = py::none(),
          "Serving export (values only) under `root` (relative to admin_root); returns its "
          "version. Read it with ExportReader(admin_root/root).");
}

}  // namespace tessera::python
