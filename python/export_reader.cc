// The `tessera` Python module: the export reader (ps/client/export_reader.h), which serves a
// serving export from memory with no server.
#include "ps/client/export_reader.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "ps/status.h"
#include "ps/table_spec.h"
#include "python/module_internal.h"

namespace tessera::python {

void RegisterExportReader(py::module_& m) {
  m.def(
      "latest_export_version",
      [](const std::string& root) { return Take(LatestExportVersion(root)); }, py::arg("root"),
      "The latest complete export version under `root` (0 when there is none).");

  auto open = [](const std::string& root, uint64_t version) {
    Result<std::unique_ptr<ExportReader>> r = [&] {
      py::gil_scoped_release nogil;
      return ExportReader::Open(root, version);
    }();
    return std::shared_ptr<ExportReader>(Take(std::move(r)));
  };
  auto spec_of = [](const ExportReader& r, const std::string& table) {
    return Take(r.spec(table));
  };
  py::class_<ExportReader, std::shared_ptr<ExportReader>>(
      m, "ExportReader",
      "A serving export loaded into memory (no server needed). Immutable: lookups from any "
      "number of threads.")
      .def(py::init(open), py::arg("root"), py::arg("version") = 0,
           "Opens version `version` under `root` (0: the latest).")
      .def_static("open", open, py::arg("root"), py::arg("version") = 0)
      .def_property_readonly("version", &ExportReader::version)
      .def("tables", &ExportReader::tables)
      .def("spec", spec_of, py::arg("table"))
      .def(
          "lookup",
          [spec_of](const ExportReader& r, const std::string& table, py::handle keys,
                    std::optional<py::object> out) {
            const TableSpec spec = spec_of(r, table);
            if (spec.kind != TableKind::kSparse) {
              Raise(Status::InvalidArgument("table '" + table + "' is not a sparse table"));
            }
            const Keys k = AsKeys(keys);
            py::array a = OutRows(out, k, spec.dim);
            float* dst = MutableFloats(a);
            Status s;
            {
              py::gil_scoped_release nogil;
              s = r.Lookup(table, k.span, dst);
            }
            Check(s);
            return a;
          },
          py::arg("table"), py::arg("keys"), py::arg("out") = py::none(),
          "Rows of `keys` (initializer values for keys without a row).")
      .def(
          "dense_read",
          [spec_of](const ExportReader& r, const std::string& table, uint64_t offset,
                    std::optional<uint64_t> length, std::optional<py::object> out) {
            const TableSpec spec = spec_of(r, table);
            auto [off, len] = DenseRange(spec, offset, length);
            py::array a = OutDense(out, len);
            float* dst = MutableFloats(a);
            Status s;
            {
              py::gil_scoped_release nogil;
              s = r.DenseRead(table, off, len, dst);
            }
            Check(s);
            return a;
          },
          py::arg("table"), py::arg("offset") = 0, py::arg("length") = py::none(),
          py::arg("out") = py::none())
      .def(
          "row_count",
          [](const ExportReader& r, const std::string& table) { return Take(r.RowCount(table)); },
          py::arg("table"));
}

}  // namespace tessera::python
