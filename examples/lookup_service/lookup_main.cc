// tessera-lookup: a small online "service" that embeds the Tessera client library (and nothing
// else: no RocksDB, no worker runtime) and answers embedding lookups for lists of keys, either
// from a running cluster (Client::GetTable + Pull) or from a serving export on disk
// (ExportReader, no server needed).
//
//   tessera-lookup --cluster=tcp://127.0.0.1:7000,tcp://127.0.0.1:7001 --table=ctr/emb --keys=1,2
//   tessera-lookup --export_dir=/srv/exports --table=ctr/emb --keys=1,2,3
//   printf '1,2\n3\n' | tessera-lookup --cluster=... --table=ctr/emb --stdin
//
// Output: one line per key, "KEY<TAB>v0 v1 ... v(dim-1)", in request order (duplicates
// allowed). With --stdin every input line is one request; an empty line separates answers.
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

#include "ps/client/client.h"
#include "ps/client/export_reader.h"
#include "ps/routing.h"
#include "ps/status.h"
#include "ps/table_spec.h"
#include "worker/keys.h"  // Header-only: MakeKey for --field; no link dependency.

namespace {

using tessera::Result;
using tessera::Status;

constexpr char kUsage[] =
    "usage: tessera-lookup (--cluster=EPS | --export_dir=ROOT) [--table=NAME] "
    "(--keys=K1,K2,... | --stdin)\n"
    "  --cluster=EPS       server endpoints in rank order, comma-separated, or @FILE\n"
    "  --export_dir=ROOT   answer from the serving export under ROOT (no server)\n"
    "  --export_version=N  export version to open (default 0: the latest)\n"
    "  --table=NAME        sparse table to read (default ctr/emb)\n"
    "  --keys=LIST         keys, comma-separated, decimal or 0x-hex\n"
    "  --field=F           the keys are raw categorical values of field F: look up\n"
    "                      MakeKey(F, value), as the CTR job stores them\n"
    "  --stdin             read one request (a key list) per input line\n"
    "  --timeout_ms=MS     deadline of each cluster request (default 5000)\n"
    "  --precision=P       digits after the decimal point (default 6)\n";

struct Flags {
  std::string cluster;
  std::string export_dir;
  uint64_t export_version = 0;
  std::string table = "ctr/emb";
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

Result<Flags> ParseFlags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") return Status::Cancelled("help");
    if (arg == "--stdin") {
      f.from_stdin = true;
      continue;
    }
    const size_t eq = arg.find('=');
    if (arg.substr(0, 2) != "--" || eq == std::string_view::npos) {
      return Status::InvalidArgument("unexpected argument '" + std::string(arg) + "'");
    }
    const std::string_view name = arg.substr(2, eq - 2);
    const std::string_view value = arg.substr(eq + 1);
    if (name == "cluster") {
      f.cluster = value;
    } else if (name == "export_dir") {
      f.export_dir = value;
    } else if (name == "export_version") {
      TESSERA_ASSIGN_OR_RETURN(f.export_version, ParseUint(value, "--export_version"));
    } else if (name == "table") {
      f.table = value;
    } else if (name == "keys") {
      f.keys = value;
    } else if (name == "field") {
      TESSERA_ASSIGN_OR_RETURN(uint64_t field, ParseUint(value, "--field"));
      if (field >= tessera::worker::kMaxFields) {
        return Status::InvalidArgument("--field must be < " +
                                       std::to_string(tessera::worker::kMaxFields));
      }
      f.field = static_cast<uint32_t>(field);
    } else if (name == "timeout_ms") {
      TESSERA_ASSIGN_OR_RETURN(uint64_t ms, ParseUint(value, "--timeout_ms"));
      f.timeout_ms = static_cast<int64_t>(ms);
    } else if (name == "precision") {
      TESSERA_ASSIGN_OR_RETURN(uint64_t p, ParseUint(value, "--precision"));
      f.precision = static_cast<int>(std::min<uint64_t>(p, 9));
    } else {
      return Status::InvalidArgument("unknown flag --" + std::string(name));
    }
  }
  if (f.cluster.empty() == f.export_dir.empty()) {
    return Status::InvalidArgument("give exactly one of --cluster and --export_dir");
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
      keys.push_back(field ? tessera::worker::MakeKey(*field, k) : k);
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
    TESSERA_ASSIGN_OR_RETURN(auto servers, tessera::ParseClusterList(f.cluster));
    tessera::ClientOptions o;
    o.servers = std::move(servers);
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
  if (!f.cluster.empty()) {
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
  auto flags = ParseFlags(argc, argv);
  if (!flags.ok()) {
    if (flags.status().code() == tessera::StatusCode::kCancelled) {
      std::fputs(kUsage, stdout);
      return 0;
    }
    std::fprintf(stderr, "tessera-lookup: %s\n%s", flags.status().ToString().c_str(), kUsage);
    return 2;
  }
  const Status s = Run(*flags);
  if (!s.ok()) {
    std::fprintf(stderr, "tessera-lookup: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
