// The client's administrative calls: metadata records, server statistics, cluster
// checkpoints and restores, serving exports.
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "ps/admin_marker.h"
#include "ps/admin_path.h"
#include "ps/client/client.h"
#include "ps/client/client_internal.h"
#include "ps/client/export_reader.h"

namespace tessera {

Status Client::PutMeta(const std::string& name, std::string_view value, Deadline deadline) {
  Header h = impl_->BaseHeader(Op::kPutMeta);
  h.name = name;
  h.elem_type = ElemType::kBytes;
  h.count = 1;
  std::string data(value);
  return impl_->Blocking(h, impl_->MetaServers(), deadline, &data).status();
}

Result<std::optional<std::string>> Client::GetMeta(const std::string& name, Deadline deadline) {
  Header h = impl_->BaseHeader(Op::kGetMeta);
  h.name = name;
  std::string data;
  TESSERA_ASSIGN_OR_RETURN(Header r, impl_->Blocking(h, {impl_->CoordServer()}, deadline, &data));
  if (r.count == 0) return std::optional<std::string>();
  return std::optional<std::string>(std::move(data));
}

Result<std::string> Client::ServerStats(uint32_t rank, Deadline deadline) {
  if (rank >= num_servers()) return Status::InvalidArgument("no server " + std::to_string(rank));
  std::string text;
  TESSERA_ASSIGN_OR_RETURN(Header r,
                           impl_->Blocking(impl_->BaseHeader(Op::kStats), {rank}, deadline, &text));
  (void)r;
  return text;
}

namespace {
std::string_view SlotsFrame(std::span<const uint32_t> slots) {
  return std::string_view(reinterpret_cast<const char*>(slots.data()),
                          slots.size() * sizeof(uint32_t));
}
}  // namespace

Result<std::string> Client::ExportSlots(uint32_t rank, uint64_t map_version,
                                        std::span<const uint32_t> slots,
                                        const SlotExportRequest& how, Deadline deadline) {
  if (rank >= num_servers()) return Status::InvalidArgument("no server " + std::to_string(rank));
  Header h = impl_->BaseHeader(Op::kSlotExport);
  h.map_version = map_version;
  h.count = how.dense_parts ? (how.backup_fill ? 3 : 4)
                            : how.backup_fill ? 2 : how.still_owned ? 1 : 0;
  std::vector<std::string_view> frames = {SlotsFrame(slots)};
  if (!how.since.empty()) {
    frames.emplace_back(reinterpret_cast<const char*>(how.since.data()),
                        how.since.size() * sizeof(uint64_t));
  }
  std::string rows;
  TESSERA_RETURN_IF_ERROR(impl_->SendAndWait(h, {rank}, frames, deadline, &rows).status());
  return rows;
}

Status Client::ImportSlots(uint32_t rank, uint64_t map_version, std::span<const uint32_t> slots,
                           SlotImportStep step, std::string_view rows, Deadline deadline) {
  if (rank >= num_servers()) return Status::InvalidArgument("no server " + std::to_string(rank));
  Header h = impl_->BaseHeader(Op::kSlotImport);
  h.map_version = map_version;
  h.count = static_cast<uint64_t>(step);
  std::vector<std::string_view> frames = {SlotsFrame(slots)};
  if (step != SlotImportStep::kDone && step != SlotImportStep::kDenseDone) frames.push_back(rows);
  return impl_->SendAndWait(h, {rank}, frames, deadline, nullptr).status();
}

Status Client::DropSlots(uint32_t rank, uint64_t map_version, std::span<const uint32_t> slots,
                         Deadline deadline) {
  if (rank >= num_servers()) return Status::InvalidArgument("no server " + std::to_string(rank));
  Header h = impl_->BaseHeader(Op::kSlotDrop);
  h.map_version = map_version;
  return impl_->SendAndWait(h, {rank}, {SlotsFrame(slots)}, deadline, nullptr).status();
}

namespace {
// Reads "name value" from a stats text; 0 when absent.
int64_t StatValue(const std::string& text, const std::string& name) {
  const std::string needle = name + " ";
  size_t pos = 0;
  while ((pos = text.find(needle, pos)) != std::string::npos) {
    if (pos == 0 || text[pos - 1] == '\n') {
      return std::strtoll(text.c_str() + pos + needle.size(), nullptr, 10);
    }
    pos += needle.size();
  }
  return 0;
}
// Where this process sees admin directory `name` (under ClientOptions::admin_root) for the
// marker files it writes itself; `what` names the call in the error.
Result<std::string> LocalAdminPath(const ClientOptions& o, const std::string& name,
                                   const char* what) {
  TESSERA_RETURN_IF_ERROR(ValidateAdminName(name).WithContext(what));
  if (o.admin_root.empty()) {
    return Status::FailedPrecondition(
        std::string(what) +
        " writes its marker files itself: set ClientOptions::admin_root (tessera-ctl "
        "--admin_root) to the servers' --admin_root as this process sees it");
  }
  TESSERA_ASSIGN_OR_RETURN(std::string root, CanonicalAdminRoot(o.admin_root));
  return ResolveAdminPath(root, name);
}

bool RetryAdminRequest(const Client& c, const Status& refused, uint64_t version,
                       Deadline deadline) {
  // A cut the job ran past is proposed again later; a request refused because the cluster
  // map changed (a fail-over, a move) goes again at the new version, once this client has it.
  const std::string& why = refused.message();
  if (refused.code() != StatusCode::kFailedPrecondition) return false;
  if (why.find("already passed") != std::string::npos) return true;
  const bool map_changed = why.find("stale cluster map") != std::string::npos ||
                           why.find("the cluster map changed") != std::string::npos;
  if (version == 0 || !map_changed) return false;
  // (A server behind the client refuses too: then this client's map does not change.)
  const auto limit = std::min(deadline, DeadlineAfterMs(1000));
  while (c.cluster_map_version() == version && std::chrono::steady_clock::now() < limit) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return std::chrono::steady_clock::now() < deadline;
}

}  // namespace

Result<int64_t> Client::Checkpoint(const std::string& name, Deadline deadline) {
  // The servers resolve `name` under their --admin_root; this process writes CHECKPOINT at
  // the same place under its view of that root.
  TESSERA_ASSIGN_OR_RETURN(const std::string dir, LocalAdminPath(options(), name, "checkpoint"));
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::IOError("cannot create '" + dir + "': " + ec.message());
  if (std::filesystem::exists(dir + "/CHECKPOINT", ec) || ec) {
    return ec ? Status::IOError("cannot read '" + dir + "': " + ec.message())
              : Status::AlreadyExists("'" + name + "' already holds a checkpoint");
  }
  int64_t cut = -1;
  bool taken = false;
  std::vector<uint32_t> servers;
  uint64_t version = 0;
  for (int attempt = 0; attempt < 20 && !taken; ++attempt) {
    // All at one map version (0: a static cluster); the servers refuse another one.
    version = cluster_map_version();
    servers = impl_->AllServers();
    // Where the job is: the cut goes after the steps every server has seen pushed.
    uint32_t workers = 0;
    int64_t max_clock = 0, max_push = -1;
    for (uint32_t r : servers) {
      TESSERA_ASSIGN_OR_RETURN(std::string st, ServerStats(r, deadline));
      workers = std::max<uint32_t>(workers, static_cast<uint32_t>(StatValue(st, "job_workers")));
      max_clock = std::max(max_clock, StatValue(st, "max_clock"));
      max_push = std::max(max_push, StatValue(st, "max_push_clock"));
    }
    cut = std::max(max_clock - 1, max_push) + attempt;
    Header h = impl_->BaseHeader(Op::kCheckpoint);
    h.name = name;
    h.clock = cut;
    h.num_workers = workers;
    h.map_version = version;
    auto r = impl_->Blocking(h, servers, deadline, nullptr, deadline);
    if (r.ok()) {
      taken = true;
      break;
    }
    // Abort everywhere before trying again (or giving up).
    Header abort = impl_->BaseHeader(Op::kCheckpoint);
    abort.count = 1;
    abort.name = name;  // a server aborts only the checkpoint an abort names
    (void)impl_->Blocking(abort, impl_->AllServers(), DeadlineAfterMs(10000)).status();
    if (!RetryAdminRequest(*this, r.status(), version, deadline)) return r.status();
  }
  if (!taken) return Status::Unavailable("the job kept running past every proposed cut");
  std::ofstream marker(dir + "/CHECKPOINT");
  marker << "tessera checkpoint\nservers " << servers.size() << "\ncut_clock " << cut << "\n";
  if (version != 0) {
    marker << "server_ids " << FormatServerIds(servers) << "\nmap_version " << version << "\n";
  }
  marker.close();
  if (!marker) return Status::IOError("cannot write '" + dir + "/CHECKPOINT'");
  return cut;
}

Result<uint64_t> Client::Export(const std::string& name, bool delta, Deadline deadline) {
  TESSERA_ASSIGN_OR_RETURN(const std::string root, LocalAdminPath(options(), name, "export"));
  std::error_code ec;
  std::filesystem::create_directories(root, ec);
  if (ec) return Status::IOError("cannot create '" + root + "': " + ec.message());
  TESSERA_ASSIGN_OR_RETURN(uint64_t latest, LatestExportVersion(root));
  if (delta && latest == 0) {
    return Status::FailedPrecondition("a delta export needs a previous export in '" + root + "'");
  }
  const uint64_t version = latest + 1;
  const std::string dir = root + "/v" + std::to_string(version);
  Header h = impl_->BaseHeader(Op::kExport);
  h.name = name + "/v" + std::to_string(version);  // the servers resolve it under their root
  h.count = delta ? 1 : 0;
  h.offset = delta ? latest : 0;  // the base version
  std::vector<uint32_t> servers;
  for (int attempt = 0;; ++attempt) {
    h.map_version = cluster_map_version();  // all at one version (0: a static cluster)
    servers = impl_->AllServers();
    Status s = impl_->Blocking(h, servers, deadline, nullptr, deadline).status();
    if (s.ok()) break;
    if (attempt >= 20 || !RetryAdminRequest(*this, s, h.map_version, deadline)) return s;
  }
  {
    std::ofstream marker(dir + "/EXPORT");
    marker << "tessera export\nversion " << version << "\nkind " << (delta ? "delta" : "full")
           << "\nbase " << (delta ? latest : 0) << "\nservers " << servers.size() << "\n";
    if (h.map_version != 0) {
      marker << "server_ids " << FormatServerIds(servers) << "\nmap_version " << h.map_version
             << "\n";
    }
    if (!marker) return Status::IOError("cannot write '" + dir + "/EXPORT'");
  }
  // Readers follow LATEST; replace it atomically.
  {
    std::ofstream l(root + "/LATEST.tmp");
    l << version << "\n";
    if (!l) return Status::IOError("cannot write '" + root + "/LATEST.tmp'");
  }
  std::filesystem::rename(root + "/LATEST.tmp", root + "/LATEST", ec);
  if (ec) return Status::IOError("cannot update '" + root + "/LATEST': " + ec.message());
  return version;
}

Status Client::Restore(const std::string& name, Deadline deadline) {
  TESSERA_RETURN_IF_ERROR(ValidateAdminName(name).WithContext("restore"));
  Header h = impl_->BaseHeader(Op::kRestore);
  h.name = name;
  h.map_version = cluster_map_version();
  return impl_->Blocking(h, impl_->AllServers(), deadline, nullptr, deadline).status();
}

}  // namespace tessera
