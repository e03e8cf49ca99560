// The client's calls: sparse and dense push/pull, clocks, barriers and blocking requests,
// built on the caller's thread and handed to the I/O thread (client_io.cc); ClientImpl's
// construction and destruction.
#include "ps/client/client.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <random>

#include "ps/client/client_internal.h"
#include "ps/client/dense_chunks_internal.h"
#include "ps/client/dense_reply_internal.h"
#include "ps/client/key_index_internal.h"
#include "ps/limits.h"
#include "ps/message_pool_internal.h"

namespace tessera {
namespace internal {
namespace {

// How the keys of one sparse call map to unique keys and to servers; the reply callbacks
// share it.
struct SparsePlan {
  size_t n = 0;            // caller keys
  size_t num_unique = 0;   // unique keys
  // The caller's keys are strictly increasing (unique): a unique index is a caller index, and
  // unique_of and unique_keys stay empty (no dedup).
  bool presorted = false;
  // Presorted keys that all go to one server, in the caller's order: members stays empty
  // (the server's k-th key is caller key k).
  bool whole = false;
  std::vector<uint32_t> unique_of;  // caller index -> unique index (not presorted)
  std::vector<uint64_t> unique_keys;  // not presorted
  std::vector<std::vector<uint32_t>> members;  // per server: unique indices in sent order
  // Pulls with repeated keys: the rows in unique order, read into the caller's order once
  // every part is in; for a call to one server, its reply itself (no copy), else copied
  // into unique_values.
  zmq::message_t reply;
  std::vector<float> unique_values;
};

// Dedupe: the unique index of every key, in first-seen order; none for strictly increasing
// keys (one pass finds them), which are their own unique keys.
std::shared_ptr<SparsePlan> DedupeKeys(std::span<const uint64_t> keys) {
  auto plan = std::make_shared<SparsePlan>();
  plan->n = keys.size();
  if (StrictlyIncreasing(keys)) {
    plan->presorted = true;
    plan->num_unique = keys.size();
    return plan;
  }
  plan->unique_of.resize(keys.size());
  // One table per calling thread, kept between calls: no allocation, no page faults on every
  // request.
  thread_local KeyIndex index;
  index.Dedupe(keys, &plan->unique_keys, plan->unique_of.data());
  plan->num_unique = plan->unique_keys.size();
  return plan;
}

// The data frames of a sparse call, per server (empty where a server gets no key).
struct SparseFrames {
  std::vector<uint32_t> count;            // unique keys sent to each server
  std::vector<zmq::message_t> key_msgs;   // their keys
  std::vector<zmq::message_t> grad_msgs;  // pushes: their gradients, duplicates summed
};

// The caller's buffers of a sparse call that its frames may point into instead of copying
// them (null: copy), kept alive by a reference in each message.
struct SparseOwners {
  std::shared_ptr<const void> keys, grads;
};

// Presorted keys that all go to one server: its frames are the caller's keys and gradients,
// whole (without owners, one copy of each).
SparseFrames PackWhole(std::span<const uint64_t> keys, std::span<const float> grads, bool push,
                       const SparseOwners& owners) {
  auto frame = [](const void* p, size_t bytes, const std::shared_ptr<const void>& owner) {
    if (owner == nullptr) return MessagePool::Shared().Copy(p, bytes);
    auto* ref = new std::shared_ptr<const void>(owner);
    // ZeroMQ only reads a message's data; its free function takes a non-const pointer.
    return zmq::message_t(
        const_cast<void*>(p), bytes,
        [](void*, void* hint) { delete static_cast<std::shared_ptr<const void>*>(hint); }, ref);
  };
  SparseFrames f{{static_cast<uint32_t>(keys.size())}, {}, {}};
  f.key_msgs.push_back(frame(keys.data(), keys.size_bytes(), owners.keys));
  f.grad_msgs.push_back(push ? frame(grads.data(), grads.size_bytes(), owners.grads)
                             : zmq::message_t());
  return f;
}

// Routes the unique keys of `plan` to servers (filling plan->members) and packs each server's
// keys and, for a push, gradients (`grads` in the caller's key order, `dim` floats a key).
// Presorted keys for one server go whole (PackWhole).
SparseFrames PackSparse(const SlotMap& slot_map, std::span<const uint64_t> keys,
                        std::span<const float> grads, uint32_t dim, bool push, SparsePlan* plan,
                        const SparseOwners& owners) {
  const size_t n = plan->n;
  const uint32_t S = slot_map.num_servers();
  if (plan->presorted && S == 1) {
    plan->whole = true;
    return PackWhole(keys, grads, push, owners);
  }
  const std::span<const uint64_t> unique =
      plan->presorted ? keys : std::span<const uint64_t>(plan->unique_keys);
  const size_t U = unique.size();
  const bool has_dups = U != n;
  // Route unique keys to servers.
  std::vector<uint32_t> count(S, 0), server_of(U), pos(U);
  for (size_t u = 0; u < U; ++u) {
    const uint32_t s = slot_map.ServerOfKey(unique[u]);
    server_of[u] = s;
    pos[u] = count[s]++;
  }
  plan->members.resize(S);
  std::vector<zmq::message_t> key_msgs(S), grad_msgs(S);
  for (uint32_t s = 0; s < S; ++s) {
    if (count[s] == 0) continue;
    plan->members[s].resize(count[s]);
    key_msgs[s] = MessagePool::Shared().Message(size_t{count[s]} * 8);
    if (push) grad_msgs[s] = MessagePool::Shared().Message(size_t{count[s]} * dim * 4);
  }
  for (size_t u = 0; u < U; ++u) {
    const uint32_t s = server_of[u];
    plan->members[s][pos[u]] = static_cast<uint32_t>(u);
    static_cast<uint64_t*>(key_msgs[s].data())[pos[u]] = unique[u];
  }
  if (push) {
    if (!has_dups) {
      for (size_t i = 0; i < n; ++i) {
        float* dst = static_cast<float*>(grad_msgs[server_of[i]].data()) + size_t{pos[i]} * dim;
        std::memcpy(dst, grads.data() + i * dim, sizeof(float) * dim);
      }
    } else {
      for (uint32_t s = 0; s < S; ++s) {
        if (count[s]) std::memset(grad_msgs[s].data(), 0, grad_msgs[s].size());
      }
      for (size_t i = 0; i < n; ++i) {
        const uint32_t u = plan->unique_of[i];
        float* dst = static_cast<float*>(grad_msgs[server_of[u]].data()) + size_t{pos[u]} * dim;
        const float* src = grads.data() + i * dim;
        for (uint32_t j = 0; j < dim; ++j) dst[j] += src[j];
      }
    }
  }
  return SparseFrames{std::move(count), std::move(key_msgs), std::move(grad_msgs)};
}

// Makes `call` write each server's reply rows of table `name` into `out`, in the caller's key
// order (through the rows in unique order when keys repeat).
void SetPullReply(Call* call, const std::shared_ptr<SparsePlan>& plan, float* out, uint32_t dim,
                  const std::string& name) {
  const size_t n = plan->n;
  const bool has_dups = plan->num_unique != n;
  call->on_reply = [plan, out, dim, name, has_dups](uint32_t s, const std::vector<uint32_t>* rows,
                                                    const Header& h,
                                                    std::vector<zmq::message_t>& frames) -> Status {
    // A whole call (presorted keys, one server) has no member list: member k is k.
    const std::vector<uint32_t>* m = plan->whole ? nullptr : &plan->members[s];
    const size_t count = rows != nullptr ? rows->size() : m != nullptr ? m->size() : plan->n;
    if (frames.size() != 1 || frames[0].size() != count * dim * sizeof(float) ||
        h.count != count) {
      return Status::Internal("malformed pull reply from server " + std::to_string(s) +
                              " for table '" + name + "'");
    }
    const bool aligned = reinterpret_cast<uintptr_t>(frames[0].data()) % alignof(float) == 0;
    if (m == nullptr && rows == nullptr) {  // the caller's rows, in its order
      std::memcpy(out, frames[0].data(), frames[0].size());
      return Status::OK();
    }
    if (has_dups && plan->members.size() == 1 && rows == nullptr && aligned) {
      plan->reply = std::move(frames[0]);  // the whole call's rows, in unique order
      return Status::OK();
    }
    const float* src = static_cast<const float*>(frames[0].data());
    std::vector<float> copy;
    if (!aligned) {
      copy.resize(count * dim);
      std::memcpy(copy.data(), frames[0].data(), frames[0].size());
      src = copy.data();
    }
    // Without repeated keys a unique index is a caller index: straight into `out`.
    float* dst = out;
    if (has_dups) {
      plan->unique_values.resize(plan->num_unique * dim);
      dst = plan->unique_values.data();
    }
    for (size_t k = 0; k < count; ++k) {
      const size_t i = rows != nullptr ? (*rows)[k] : k;
      const size_t u = m != nullptr ? (*m)[i] : i;
      std::memcpy(dst + size_t{u} * dim, src + k * dim, sizeof(float) * dim);
    }
    return Status::OK();
  };
  if (has_dups) {
    call->on_done = [plan, out, dim, n] {
      const float* rows = plan->reply.size() != 0 ? static_cast<const float*>(plan->reply.data())
                                                  : plan->unique_values.data();
      for (size_t i = 0; i < n; ++i) {
        std::memcpy(out + i * dim, rows + size_t{plan->unique_of[i]} * dim, sizeof(float) * dim);
      }
      plan->reply = zmq::message_t();
    };
  }
}

// A message of `n` floats at `p`: a copy (in a pooled buffer), or, with an `owner` that keeps
// them alive, the floats themselves (the message holds a reference to `owner` until ZeroMQ
// frees it).
zmq::message_t GradientFrame(const float* p, uint64_t n, const std::shared_ptr<const void>& owner) {
  if (owner == nullptr) return MessagePool::Shared().Copy(p, n * sizeof(float));
  return SharedMessage(p, n * sizeof(float), owner);
}

}  // namespace

uint64_t RandomClientId() {
  std::random_device rd;
  uint64_t id = 0;
  while (id == 0) id = (uint64_t{rd()} << 32) ^ rd();
  return id;
}

ClientImpl::ClientImpl(const ClientOptions& o, std::unique_ptr<ClusterMapSource> source,
                       std::optional<RoutingMap> map)
    : options_(o), client_id_(RandomClientId()), source_(std::move(source)) {
  if (map) {
    dense_servers_ = map->dense_servers != 0 ? map->dense_servers
                                             : static_cast<uint32_t>(map->addresses.size());
    routing_ = std::make_shared<const RoutingMap>(std::move(*map));
  } else {
    dense_servers_ = static_cast<uint32_t>(o.servers.size());
    RoutingMap m;
    m.addresses = o.servers;
    m.primary = SlotMap::Uniform(static_cast<uint32_t>(o.servers.size()));
    routing_ = std::make_shared<const RoutingMap>(std::move(m));
  }
}

ClientImpl::~ClientImpl() {
  // The refresher first (it reads from the source), then the source's watch: no map arrives
  // from here on.
  {
    MutexLock l(map_mu_);
    refresh_stop_ = true;
  }
  refresh_cv_.notify_all();
  if (refresher_.joinable()) refresher_.join();
  source_.reset();
  stop_.store(true);
  Wake();
  if (io_.joinable()) io_.join();
  if (event_fd_ >= 0) close(event_fd_);
}

std::shared_ptr<Call> CompletedCall(Status s) {
  auto c = std::make_shared<Call>();
  MutexLock l(c->mu);  // not shared yet: taken for the analysis
  c->done = true;
  c->done_flag.store(true);
  c->status = std::move(s);
  return c;
}

Header ClientImpl::BaseHeader(Op op) const {
  Header h;
  h.op = op;
  h.worker_id = options_.worker_id;
  h.clock = clock_.load();
  h.staleness = options_.consistency.staleness;
  h.num_workers = options_.consistency.num_workers;
  if (IsPush(op)) {
    h.lr_scale = lr_scale_.load(std::memory_order_relaxed);
  }
  return h;
}

Handle ClientImpl::SparseCall(Op op, const Table& t, std::span<const uint64_t> keys,
                              std::span<const float> grads, float* out,
                              std::shared_ptr<const void> key_owner,
                              std::shared_ptr<const void> grad_owner) {
  if (t.spec.kind != TableKind::kSparse || t.id == 0) {
    return Handle(CompletedCall(
        Status::InvalidArgument("table '" + t.spec.name + "' is not a sparse table")));
  }
  const uint32_t dim = t.spec.dim;
  const bool push = op != Op::kSparsePull, pull = op != Op::kSparsePush;
  if (push && grads.size() != keys.size() * dim) {
    return Handle(CompletedCall(Status::InvalidArgument(
        "table '" + t.spec.name + "': " + std::to_string(keys.size()) + " keys x dim " +
        std::to_string(dim) + " need " + std::to_string(keys.size() * dim) +
        " gradient floats, got " + std::to_string(grads.size()))));
  }
  if (pull && out == nullptr && !keys.empty()) {
    return Handle(CompletedCall(Status::InvalidArgument("null output buffer")));
  }
  if (keys.empty()) return Handle(CompletedCall(Status::OK()));

  const std::shared_ptr<const RoutingMap> map = Routing();
  const uint32_t S = map->primary.num_servers();
  std::shared_ptr<SparsePlan> plan = DedupeKeys(keys);
  SparseFrames frames = PackSparse(map->primary, keys, grads, dim, push, plan.get(),
                                   SparseOwners{std::move(key_owner), std::move(grad_owner)});
  auto call = std::make_shared<Call>();
  if (push) call->push = Call::PushKind::kSparse;
  if (pull) SetPullReply(call.get(), plan, out, dim, t.spec.name);
  std::vector<Outgoing> msgs;
  const Deadline deadline = RequestDeadline();
  for (uint32_t s = 0; s < S; ++s) {
    if (frames.count[s] == 0) continue;
    Header h = BaseHeader(op);
    h.map_version = map->version;
    h.table_id = t.id;
    h.elem_type = ElemType::kF32;
    h.count = frames.count[s];
    h.dim = dim;
    std::vector<zmq::message_t> data;
    data.push_back(std::move(frames.key_msgs[s]));
    if (push) data.push_back(std::move(frames.grad_msgs[s]));
    msgs.push_back(MakeOutgoing(s, h, std::move(data), call, deadline));
  }
  Send(call, std::move(msgs));
  return Handle(call);
}

Handle ClientImpl::DenseCall(Op op, const Table& t, uint64_t offset, uint64_t length,
                             std::span<const float> grads, float* out,
                             std::shared_ptr<const void> owner) {
  if (t.spec.kind != TableKind::kDense || t.id == 0) {
    return Handle(
        CompletedCall(Status::InvalidArgument("table '" + t.spec.name + "' is not a dense table")));
  }
  if (length == 0 || offset > t.spec.length || length > t.spec.length - offset) {
    return Handle(CompletedCall(Status::InvalidArgument(
        "dense range [" + std::to_string(offset) + ", " + std::to_string(offset + length) +
        ") outside table '" + t.spec.name + "' of length " + std::to_string(t.spec.length))));
  }
  const bool push = op == Op::kDensePush;
  if (!push && out == nullptr) {
    return Handle(CompletedCall(Status::InvalidArgument("null output buffer")));
  }
  auto call = std::make_shared<Call>();
  if (push) call->push = Call::PushKind::kDense;
  const std::shared_ptr<const RoutingMap> map = Routing();
  const uint64_t map_version = map->version;
  const uint32_t S = dense_servers_;
  std::vector<Outgoing> msgs;
  // Per part: its range [b, e) of the call, cut into requests of `chunk` floats (the last
  // one shorter) that travel and are applied one after another, overlapping.
  const DenseChunking chunking(options_.dense_chunk_bytes / sizeof(float));
  auto ranges = std::make_shared<std::vector<std::pair<uint64_t, uint64_t>>>(S);
  const Deadline deadline = RequestDeadline();
  for (uint32_t s = 0; s < S; ++s) {
    const DenseRange r = DenseRangeOfServer(t.id, t.spec.length, s, S);
    const uint64_t b = std::max(offset, r.begin), e = std::min(offset + length, r.end);
    if (b >= e) continue;
    (*ranges)[s] = {b, e};
    for (uint64_t cb = b; cb < e;) {
      const uint64_t ce = chunking.End(cb, e);
      Header h = BaseHeader(op);
      h.map_version = map_version;
      h.table_id = t.id;
      h.elem_type = ElemType::kF32;
      h.offset = cb;
      h.count = ce - cb;
      // A pull's values may come as frames of several server chunks each, sent from the
      // table uncopied (an index frame says which chunks each holds).
      if (!push) h.dim = kDensePullRunFrames;
      std::vector<zmq::message_t> data;
      if (push) data.push_back(GradientFrame(grads.data() + (cb - offset), ce - cb, owner));
      // Part s is served by its primary in the map (server s unless a fail-over moved it);
      // the reply is matched to the part and, by its offset, to the chunk.
      msgs.push_back(MakeOutgoing(map->DenseOwner(s), h, std::move(data), call, deadline));
      msgs.back().part = s;
      cb = ce;
    }
  }
  if (!push) {
    call->on_reply = [ranges, chunking, offset, out, name = t.spec.name](
                         uint32_t s, const std::vector<uint32_t>*, const Header& h,
                         std::vector<zmq::message_t>& frames) -> Status {
      const auto [b, e] = (*ranges)[s];
      // The reply's offset and count are checked against a chunk the part asked for: a reply
      // of another range would write outside it.
      const bool asked = h.offset >= b && h.offset < e && chunking.Starts(h.offset, b) &&
                         h.count == chunking.End(h.offset, e) - h.offset;
      // One frame, or an index frame then frames of server chunks (kDensePullRunFrames),
      // copied to the caller's buffer once the whole shape has been checked.
      const bool shaped =
          asked && CopyDenseReply(frames, h.offset, h.count, out + (h.offset - offset));
      if (!shaped) {
        return Status::Internal("malformed dense reply from server " + std::to_string(s) +
                                " for table '" + name + "': " + std::to_string(h.count) +
                                " floats at " + std::to_string(h.offset) + " in " +
                                std::to_string(frames.size()) + " frame(s), asked for [" +
                                std::to_string(b) + ", " + std::to_string(e) + ")");
      }
      return Status::OK();
    };
  }
  Send(call, std::move(msgs));
  return Handle(call);
}

Result<Header> ClientImpl::Blocking(Header h, std::vector<uint32_t> servers, Deadline deadline,
                                    std::string* data, Deadline request_deadline) {
  std::vector<std::string_view> frames;
  if (data != nullptr && h.op == Op::kPutMeta) frames.push_back(*data);
  return SendAndWait(h, servers, frames, deadline,
                     h.op == Op::kPutMeta ? nullptr : data, request_deadline);
}

Result<Header> ClientImpl::SendAndWait(Header h, const std::vector<uint32_t>& servers,
                                       const std::vector<std::string_view>& frames,
                                       Deadline deadline, std::string* data,
                                       Deadline request_deadline) {
  // Refused here as the server would refuse it: a name over the envelope's size limit would
  // make the server's refusal unreadable (no request id), and the call would time out.
  TESSERA_RETURN_IF_ERROR(ValidateRequestLimits(h));
  auto call = std::make_shared<Call>();
  auto reply = std::make_shared<std::pair<Header, std::string>>();
  call->on_reply = [reply](uint32_t, const std::vector<uint32_t>*, const Header& rh,
                           std::vector<zmq::message_t>& frames) -> Status {
    reply->first = rh;
    if (!frames.empty()) reply->second = frames[0].to_string();
    return Status::OK();
  };
  if (request_deadline == Deadline()) request_deadline = std::min(deadline, RequestDeadline());
  std::vector<Outgoing> msgs;
  for (uint32_t s : servers) {
    std::vector<zmq::message_t> out;
    for (std::string_view f : frames) out.emplace_back(f.data(), f.size());
    msgs.push_back(MakeOutgoing(s, h, std::move(out), call, request_deadline, deadline));
  }
  Send(call, std::move(msgs));
  TESSERA_RETURN_IF_ERROR(WaitCall(*call, deadline));
  if (data != nullptr) *data = std::move(reply->second);
  return reply->first;
}

std::vector<uint32_t> ClientImpl::AllServers() const {
  // The servers of the current map (a retired id has no address); a map a client follows only
  // appends servers, and every one it names is connected before the map is installed.
  const std::shared_ptr<const RoutingMap> map = Routing();
  std::vector<uint32_t> v;
  for (uint32_t i = 0; i < map->addresses.size(); ++i) {
    if (!map->addresses[i].empty()) v.push_back(i);
  }
  return v;
}

uint32_t ClientImpl::CoordServer() const {
  const std::shared_ptr<const RoutingMap> map = Routing();
  for (uint32_t i = 0; i < map->addresses.size(); ++i) {
    if (!map->addresses[i].empty()) return i;
  }
  return 0;
}

std::vector<uint32_t> ClientImpl::MetaServers() const {
  if (source_ == nullptr) return {0};
  return AllServers();
}

Handle ClientImpl::ClockCall(int64_t value) {
  // Under clock_mu_: a server that a new map adds meanwhile gets this value or a later one
  // (ConnectNewServers sends it the clock before the map routes anything to it).
  MutexLock l(clock_mu_);
  clock_.store(value);
  auto call = std::make_shared<Call>();
  std::vector<Outgoing> msgs;
  const Deadline deadline = RequestDeadline();
  for (uint32_t s : AllServers()) {
    Header h = BaseHeader(Op::kClock);
    h.clock = value;
    msgs.push_back(MakeOutgoing(s, h, {}, call, deadline));
  }
  Send(call, std::move(msgs));
  return Handle(call);
}

}  // namespace internal

// ---------------------------------------------------------------- Client
Result<std::unique_ptr<Client>> Client::Create(const ClientOptions& options) {
  auto impl = std::make_unique<internal::ClientImpl>(options);
  TESSERA_RETURN_IF_ERROR(impl->Start());
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

Result<std::unique_ptr<Client>> Client::Create(const ClientOptions& options,
                                               std::unique_ptr<ClusterMapSource> map_source) {
  if (map_source == nullptr) return Status::InvalidArgument("null cluster map source");
  if (!options.servers.empty()) {
    return Status::InvalidArgument(
        "ClientOptions::servers must be empty with a cluster map source: the map names the "
        "servers");
  }
  Result<RoutingMap> map = map_source->Load();
  if (!map.ok()) {
    if (map.status().code() == StatusCode::kNotFound) {
      return Status::FailedPrecondition(
          "the coordinator holds no cluster map yet (" + map.status().message() +
          "): create one with `tessera-ctl map init --coordinator=... --servers=...`");
    }
    return map.status().WithContext("cannot read the cluster map");
  }
  // A retired id (a drained server, or a failed one) is never routed to; a dense range of a
  // failed dense server fails with an error naming it.
  ClientOptions o = options;
  o.servers = map->addresses;
  auto impl = std::make_unique<internal::ClientImpl>(o, std::move(map_source), std::move(*map));
  TESSERA_RETURN_IF_ERROR(impl->Start());
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

Client::Client(std::unique_ptr<internal::ClientImpl> impl) : impl_(std::move(impl)) {}
Client::~Client() = default;

Result<Table> Client::CreateTable(const TableSpec& spec, Deadline deadline) {
  TESSERA_RETURN_IF_ERROR(ValidateTableSpec(spec));
  Header h = impl_->BaseHeader(Op::kCreateTable);
  h.spec = spec;
  TESSERA_ASSIGN_OR_RETURN(Header r, impl_->Blocking(h, impl_->AllServers(), deadline));
  (void)r;
  return Table{TableIdForName(spec.name), spec};
}

Status Client::DropTable(const std::string& name, Deadline deadline) {
  if (name.empty() || name.size() > kMaxTableNameLength) {
    return Status::InvalidArgument("DropTable needs a table name of 1.." +
                                   std::to_string(kMaxTableNameLength) + " bytes");
  }
  Header h = impl_->BaseHeader(Op::kDropTable);
  h.name = name;
  return impl_->Blocking(h, impl_->AllServers(), deadline).status();
}

Result<Table> Client::GetTable(const std::string& name, Deadline deadline) {
  Header h = impl_->BaseHeader(Op::kGetTable);
  h.name = name;
  TESSERA_ASSIGN_OR_RETURN(Header r, impl_->Blocking(h, {impl_->CoordServer()}, deadline));
  if (!r.spec) return Status::Internal("GetTable reply without a spec");
  return Table{r.table_id, *r.spec};
}

Handle Client::Pull(const Table& table, std::span<const uint64_t> keys, float* out) {
  return impl_->SparseCall(Op::kSparsePull, table, keys, {}, out);
}
Handle Client::Push(const Table& table, std::span<const uint64_t> keys,
                    std::span<const float> grads) {
  return impl_->SparseCall(Op::kSparsePush, table, keys, grads, nullptr);
}
Handle Client::Push(const Table& table, std::shared_ptr<const std::vector<uint64_t>> keys,
                    std::shared_ptr<const std::vector<float>> grads) {
  if (keys == nullptr || grads == nullptr) {
    return Handle(internal::CompletedCall(Status::InvalidArgument("null key or gradient buffer")));
  }
  const std::span<const uint64_t> k(*keys);
  const std::span<const float> g(*grads);
  return impl_->SparseCall(Op::kSparsePush, table, k, g, nullptr, std::move(keys),
                           std::move(grads));
}
Handle Client::PushPull(const Table& table, std::span<const uint64_t> keys,
                        std::span<const float> grads, float* out) {
  return impl_->SparseCall(Op::kSparsePushPull, table, keys, grads, out);
}
Handle Client::DensePull(const Table& table, uint64_t offset, uint64_t length, float* out) {
  return impl_->DenseCall(Op::kDensePull, table, offset, length, {}, out);
}
Handle Client::DensePush(const Table& table, uint64_t offset, std::span<const float> grads) {
  return impl_->DenseCall(Op::kDensePush, table, offset, grads.size(), grads, nullptr);
}

Handle Client::DensePush(const Table& table, uint64_t offset,
                         std::shared_ptr<const std::vector<float>> grads) {
  if (grads == nullptr) {
    return Handle(internal::CompletedCall(Status::InvalidArgument("null gradient buffer")));
  }
  const std::span<const float> view(*grads);
  return impl_->DenseCall(Op::kDensePush, table, offset, view.size(), view, nullptr,
                          std::move(grads));
}

Handle Client::Clock() { return impl_->ClockCall(impl_->clock_.load() + 1); }
int64_t Client::clock() const { return impl_->clock_.load(); }
Handle Client::SetClock(int64_t clock) { return impl_->ClockCall(clock); }

Status Client::SetLearningRateScale(float scale) {
  if (!(scale >= 0.0f && scale <= kMaxLrScale)) {
    return Status::InvalidArgument("learning-rate scale must be in [0, " +
                                   std::to_string(kMaxLrScale) + "], got " +
                                   std::to_string(scale));
  }
  impl_->lr_scale_.store(scale, std::memory_order_relaxed);
  return Status::OK();
}
float Client::learning_rate_scale() const {
  return impl_->lr_scale_.load(std::memory_order_relaxed);
}

Status Client::Barrier(const std::string& name, Deadline deadline) {
  if (impl_->options_.consistency.num_workers == 0) {
    return Status::FailedPrecondition("Barrier needs consistency.num_workers > 0");
  }
  Header h = impl_->BaseHeader(Op::kBarrier);
  h.name = name;
  // With the request id, what tells a resend after a lost answer from the next barrier call
  // of the same name (Consistency::Arrive).
  h.client_id = impl_->client_id();
  // The barrier waits as long as the caller allows, not the per-request timeout.
  return impl_->Blocking(h, {impl_->CoordServer()}, deadline, nullptr, deadline).status();
}

Status Client::Wait(const Handle& handle, Deadline deadline) {
  if (!handle.valid()) return Status::InvalidArgument("invalid handle");
  return impl_->WaitCall(*handle.call_, deadline);
}

void Client::Cancel(const Handle& handle) {
  if (!handle.valid()) return;
  internal::Call& c = *handle.call_;
  {
    // Waits for a reply being copied into the caller's buffer; later ones see the flag.
    std::lock_guard<std::mutex> g(c.write_mu);
    c.cancelled.store(true);
  }
  {
    MutexLock l(c.mu);
    if (c.done) return;
    c.status = Status::Cancelled("call cancelled");
    c.done = true;
    c.done_flag.store(true);
    c.WakePoller();  // under mu: see Call::waiter_fd
  }
  c.cv.notify_all();
}

uint32_t Client::num_servers() const {
  return static_cast<uint32_t>(impl_->Routing()->addresses.size());
}

std::vector<uint32_t> Client::server_ids() const { return impl_->AllServers(); }

uint64_t Client::cluster_map_version() const { return impl_->Routing()->version; }
uint64_t Client::stale_map_retries() const { return impl_->stale_map_retries(); }
const ClientOptions& Client::options() const { return impl_->options_; }

}  // namespace tessera
