// tessera-lookup: a small online "service" that embeds the Tessera client library (and nothing
// else: no RocksDB, no worker runtime; gflags for its flags, like every Tessera program) and
// answers embedding lookups for lists of keys, either
// from a running cluster (Client::GetTable + Pull) or from a serving export on disk
// (ExportReader, no server needed).
//
//   tessera-lookup --cluster=tcp://127.0.0.1:7000,tcp://127.0.0.1:7001 --table=ctr/emb --keys=1,2
//   tessera-lookup --export_dir=/srv/exports --table=ctr/emb --keys=1,2,3
//   printf '1,2\n3\n' | tessera-lookup --cluster=... --table=ctr/emb --stdin
//
// Output: one line per key, "KEY<TAB>v0 v1 ... v(dim-1)", in request order (duplicates
// allowed). With --stdin every input line is one request; an empty line separates answers.
#include <gflags/gflags.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ps/cli.h"
#include "ps/client/client.h"
#include "ps/client/export_reader.h"
#include "ps/feature_keys.h"  // Header-only: MakeKey for --field; no link dependency.
#include "ps/routing.h"
#include "ps/status.h"
#include "ps/table_spec.h"

DEFINE_string(cluster, "", "Server endpoints in rank order, comma-separated, or @FILE");
DEFINE_string(export_dir, "", "Answer from the serving export under this directory (no server)");
DEFINE_uint64(export_version, 0, "Export version to open (0: the latest)");
DEFINE_string(table, "ctr/emb", "Sparse table to read");
DEFINE_string(keys, "", "Keys, separated by commas or blanks, decimal or 0x-hex");
DEFINE_int64(field, -1,
             "The keys are raw categorical values of field F: look up MakeKey(F, value), as the "
             "CTR job stores them (-1: the keys are table keys)");
DEFINE_bool(stdin, false,
            "Service loop: read one request (a key list) per input line; answers are separated "
            "by an empty line");
DEFINE_int64(timeout_ms, 5000, "Connect and request deadline of the cluster, in ms");
DEFINE_int32(precision, 6, "Digits after the decimal point (at most 9)");

namespace {

using tessera::Result;
using tessera::Status;

constexpr tessera::cli::ToolInfo kTool{
    .name = "tessera-lookup",
    .usage = "usage: tessera-lookup (--cluster=EPS | --export_dir=ROOT) [--table=NAME] "
             "(--keys=K1,K2,... | --stdin)\n"
             "Answers embedding lookups from a running cluster or from a serving export: one line "
             "per key,\nKEY<TAB>v0 v1 ... v(dim-1), in request order.",
    .flags_file = __FILE__};

struct Flags {
  std::vector<std::string> servers;  // --cluster, parsed
  std::string export_dir;
  uint64_t export_version = 0;
  std::string table;
  std::string keys;
  std::optional<uint32_t> field;
  bool from_stdin = false;
  int64_t timeout_ms = 5000;
  int precision = 6;
};

Result<uint64_t> ParseUint(std::string_view s, std::string_view what) {
  std::string str(s);
  if (str.empty() || str[0] == '-' || str[0] == '+') {
    return Status::InvalidArgument(std::string(what) + ": '" + str + "' is not a number");
  }
  errno = 0;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(str.c_str(), &end, 0);
  if (errno != 0 || end != str.c_str() + str.size()) {
    return Status::InvalidArgument(std::string(what) + ": '" + str + "' is not a number");
  }
  return static_cast<uint64_t>(v);
}

// The parsed flags, checked: InvalidArgument says which is wrong.
Result<Flags> FlagsFromGflags() {
  Flags f;
  f.export_dir = FLAGS_export_dir;
  f.export_version = FLAGS_export_version;
  f.table = FLAGS_table;
  f.keys = FLAGS_keys;
  f.from_stdin = FLAGS_stdin;
  if (FLAGS_field >= 0) {
    if (FLAGS_field >= static_cast<int64_t>(tessera::kMaxFields)) {
      return Status::InvalidArgument("--field must be < " +
                                     std::to_string(tessera::kMaxFields));
    }
    f.field = static_cast<uint32_t>(FLAGS_field);
  }
  if (FLAGS_timeout_ms <= 0) return Status::InvalidArgument("--timeout_ms must be positive");
  f.timeout_ms = FLAGS_timeout_ms;
  f.precision = std::clamp(FLAGS_precision, 0, 9);
  if (FLAGS_cluster.empty() == f.export_dir.empty()) {
    return Status::InvalidArgument("give exactly one of --cluster and --export_dir");
  }
  if (!FLAGS_cluster.empty()) {
    auto servers = tessera::ParseClusterList(FLAGS_cluster);
    if (!servers.ok()) return servers.status().WithContext("--cluster");
    f.servers = std::move(*servers);
  }
  if (f.keys.empty() == !f.from_stdin) {
    return Status::InvalidArgument("give exactly one of --keys and --stdin");
  }
  if (f.table.empty()) return Status::InvalidArgument("--table is empty");
  return f;
}

// Parses "1,2, 0x3 4" (commas and blanks separate keys); maps raw values through MakeKey when
// a field is given.
Result<std::vector<uint64_t>> ParseKeys(std::string_view list, std::optional<uint32_t> field) {
  std::vector<uint64_t> keys;
  size_t i = 0;
  while (i < list.size()) {
    const size_t j = list.find_first_of(", \t\r", i);
    const std::string_view item = list.substr(i, j == std::string_view::npos ? j : j - i);
    if (!item.empty()) {
      TESSERA_ASSIGN_OR_RETURN(uint64_t k, ParseUint(item, "key"));
      keys.push_back(field ? tessera::MakeKey(*field, k) : k);
    }
    if (j == std::string_view::npos) break;
    i = j + 1;
  }
  return keys;
}

// Where the rows come from: a cluster or an export.
class Source {
 public:
  virtual ~Source() = default;
  virtual uint32_t dim() const = 0;
  virtual Status Lookup(std::span<const uint64_t> keys, float* out) = 0;
};

class ClusterSource final : public Source {
 public:
  static Result<std::unique_ptr<Source>> Open(const Flags& f) {
    tessera::ClientOptions o;
    o.servers = f.servers;
    o.request_timeout_ms = f.timeout_ms;
    o.connect_timeout_ms = f.timeout_ms;
    TESSERA_ASSIGN_OR_RETURN(auto client, tessera::Client::Create(o));
    TESSERA_ASSIGN_OR_RETURN(tessera::Table table,
                             client->GetTable(f.table, tessera::DeadlineAfterMs(f.timeout_ms)));
    if (table.spec.kind != tessera::TableKind::kSparse) {
      return Status::InvalidArgument("table '" + f.table + "' is dense; lookups need a sparse one");
    }
    return std::unique_ptr<Source>(new ClusterSource(std::move(client), table, f.timeout_ms));
  }
  uint32_t dim() const override { return table_.spec.dim; }
  Status Lookup(std::span<const uint64_t> keys, float* out) override {
    tessera::Handle h = client_->Pull(table_, keys, out);
    Status s = client_->Wait(h, tessera::DeadlineAfterMs(timeout_ms_));
    // The caller frees `out` when this returns: a pull still in flight must not write into it.
    if (s.code() == tessera::StatusCode::kDeadlineExceeded) client_->Cancel(h);
    return s;
  }

 private:
  ClusterSource(std::unique_ptr<tessera::Client> c, tessera::Table t, int64_t timeout_ms)
      : client_(std::move(c)), table_(std::move(t)), timeout_ms_(timeout_ms) {}
  std::unique_ptr<tessera::Client> client_;
  tessera::Table table_;
  int64_t timeout_ms_;
};

class ExportSource final : public Source {
 public:
  static Result<std::unique_ptr<Source>> Open(const Flags& f) {
    TESSERA_ASSIGN_OR_RETURN(auto reader,
                             tessera::ExportReader::Open(f.export_dir, f.export_version));
    TESSERA_ASSIGN_OR_RETURN(tessera::TableSpec spec, reader->spec(f.table));
    if (spec.kind != tessera::TableKind::kSparse) {
      return Status::InvalidArgument("table '" + f.table + "' is dense; lookups need a sparse one");
    }
    return std::unique_ptr<Source>(new ExportSource(std::move(reader), f.table, spec.dim));
  }
  uint32_t dim() const override { return dim_; }
  Status Lookup(std::span<const uint64_t> keys, float* out) override {
    return reader_->Lookup(table_, keys, out);
  }

 private:
  ExportSource(std::unique_ptr<tessera::ExportReader> r, std::string table, uint32_t dim)
      : reader_(std::move(r)), table_(std::move(table)), dim_(dim) {}
  std::unique_ptr<tessera::ExportReader> reader_;
  std::string table_;
  uint32_t dim_;
};

Status Answer(Source* source, std::span<const uint64_t> keys, int precision) {
  const uint32_t dim = source->dim();
  std::vector<float> rows(keys.size() * dim);
  if (!keys.empty()) TESSERA_RETURN_IF_ERROR(source->Lookup(keys, rows.data()));
  std::string line;
  char buf[32];
  for (size_t i = 0; i < keys.size(); ++i) {
    line = std::to_string(keys[i]);
    line += '\t';
    for (uint32_t d = 0; d < dim; ++d) {
      if (d > 0) line += ' ';
      std::snprintf(buf, sizeof(buf), "%.*f", precision, rows[i * dim + d]);
      line += buf;
    }
    line += '\n';
    std::fputs(line.c_str(), stdout);
  }
  std::fflush(stdout);
  return Status::OK();
}

Status Run(const Flags& f) {
  std::unique_ptr<Source> source;
  if (!f.servers.empty()) {
    TESSERA_ASSIGN_OR_RETURN(source, ClusterSource::Open(f));
  } else {
    TESSERA_ASSIGN_OR_RETURN(source, ExportSource::Open(f));
  }
  if (!f.from_stdin) {
    TESSERA_ASSIGN_OR_RETURN(auto keys, ParseKeys(f.keys, f.field));
    return Answer(source.get(), keys, f.precision);
  }
  // Service loop: one request per line until end of input. A bad request is answered with an
  // error line on stderr and the loop goes on; a failed lookup ends it.
  std::string request;
  while (std::getline(std::cin, request)) {
    auto keys = ParseKeys(request, f.field);
    if (!keys.ok()) {
      std::fprintf(stderr, "tessera-lookup: %s\n", keys.status().ToString().c_str());
      continue;
    }
    TESSERA_RETURN_IF_ERROR(Answer(source.get(), *keys, f.precision));
    std::fputs("\n", stdout);
    std::fflush(stdout);
  }
  return Status::OK();
}

}  // namespace

int main(int argc, char** argv) {
  tessera::cli::ParseCommandLine(kTool, &argc, &argv);
  auto flags = FlagsFromGflags();
  if (!flags.ok()) {
    return tessera::cli::UsageError(
        kTool, flags.status().message() + " (tessera-lookup --help lists the flags)");
  }
  const Status s = Run(*flags);
  if (!s.ok()) {
    std::fprintf(stderr, "tessera-lookup: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
