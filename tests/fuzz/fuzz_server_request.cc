// libFuzzer target: a server's whole request path, in process and without TCP: the envelope
// decoder, the dispatch by op, every op's validation (ps/server/io_loop.cc, data_ops.cc,
// admin_ops.cc) and, for requests that pass it, the lanes, the memory tier and the replies.
//
// How: a real internal::ServerImpl (rank 0 of 2, 2 lanes, memory storage, 1 MiB request limit)
// is started on an inproc endpoint; its I/O thread is stopped at once and this thread takes its
// place, calling the same private entry points the I/O loop calls (ReceiveBurst to receive,
// decode, validate and dispatch; ForwardReplies to pass on the lanes' replies; Maintain). A
// DEALER in the server's ZeroMQ context sends the fuzzed messages and reads every reply. No
// validation code is copied: a check the server drops, the fuzzer no longer reaches. The server
// keeps its state (tables, clocks, parked requests, barriers) across inputs, as a real one
// does, and is restarted every kRestartEvery inputs so that this state stays bounded; a crash
// that needs the state of earlier inputs may not reproduce from its input alone.
//
// Input: messages until the input ends (at most kMaxMessages). A message starts with a tag
// byte. Tag < 0x80, raw: 1 + tag % 4 frames follow as chunks (u16 length, bytes), frame 0 the
// envelope as bytes. Tag >= 0x80, structured: the envelope is built from the fields that
// follow (BuildStructured) and encoded with EncodeHeader, then its frames. Admin ops
// (Checkpoint, Restore, Export) name directories under the server's admin_root, a scratch
// directory; the names reach the server as fuzzed (refusing escapes is the server's job).
//
// fuzz_server_map (the same source with TESSERA_FUZZ_FOLLOW_MAP) runs the server with
// follow_cluster_map on, as rank 1 of a fixed three-server map (MapHarness below): server 1
// backs up server 0's slots (the fuzzer's DEALER plays server 0 and sends forwarded pushes,
// replica_from = 1), its own slots are backed up by server 2 or by none, some of them are being
// imported from server 0 (SlotImport, held requests), and dense parts have backups. Two ROUTER
// sockets in the server's context stand at servers 0's and 2's addresses and answer every
// forwarded push OK (or, as the input says, with an error). Structured messages then also carry
// a map version (the server's, one off, or any), replica_from and client_origin; tag 0x7f
// installs a newer (or the same, or an older) map built from the input, as etcd would deliver.
//
// Checks beyond sanitizers: every reply decodes, carries a request id that was sent, and says
// what was wrong when it is an error.
#include <absl/container/flat_hash_map.h>
#include <glog/logging.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <unordered_set>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "ps/admin_path.h"
#include "ps/routing.h"
#include "ps/server/server_impl_internal.h"
#include "tests/fuzz/fuzz_input.h"

namespace tessera::internal {
namespace {

// ---- The I/O thread's private entry points. ps/server/ offers no test hook for them; an
// explicit instantiation may name private members ([temp.spec.general]/6), so Expose<Tag, &m>
// hands the member pointer to the friend function Get(Tag).
template <typename Tag, typename Tag::type kMember>
struct Expose {
  friend typename Tag::type Get(Tag) { return kMember; }
};
struct ReceiveBurstTag {
  using type = void (ServerImpl::*)();
  friend type Get(ReceiveBurstTag);
};
struct ForwardRepliesTag {
  using type = void (ServerImpl::*)();
  friend type Get(ForwardRepliesTag);
};
struct MaintainTag {
  using type = void (ServerImpl::*)();
  friend type Get(MaintainTag);
};
struct IoThreadTag {
  using type = IoThread ServerImpl::*;
  friend type Get(IoThreadTag);
};
struct ContextTag {
  using type = zmq::context_t ServerImpl::*;
  friend type Get(ContextTag);
};
template struct Expose<ReceiveBurstTag, &ServerImpl::ReceiveBurst>;
template struct Expose<ForwardRepliesTag, &ServerImpl::ForwardReplies>;
template struct Expose<MaintainTag, &ServerImpl::Maintain>;
template struct Expose<IoThreadTag, &ServerImpl::io_>;
template struct Expose<ContextTag, &ServerImpl::ctx_>;

#ifdef TESSERA_FUZZ_FOLLOW_MAP
constexpr bool kFollowMap = true;
#else
constexpr bool kFollowMap = false;
#endif
constexpr uint8_t kMapTag = 0x7f;  // map mode: installs a map built from the input
constexpr uint32_t kMapRank = 1;

constexpr int kMaxMessages = 16;
constexpr uint64_t kRestartEvery = 20000;
constexpr uint64_t kMaintainEvery = 1000;
// Keys per data frame (values: 4x). Larger frames cost page faults under ASan, not coverage.
constexpr uint32_t kMaxFrameItems = 512;

void Check(bool ok, const char* what, const std::string& detail = "") {
  if (!ok) {
    std::fprintf(stderr, "fuzz_server_request: invariant failed: %s %s\n", what, detail.c_str());
    std::abort();
  }
}

// The tables every server starts with (the fuzzer creates more).
std::vector<TableSpec> StartTables() {
  OptimizerSpec adagrad{.kind = OptimizerKind::kAdagrad, .learning_rate = 0.05f};
  OptimizerSpec adam{.kind = OptimizerKind::kAdam};
  TableSpec s = TableSpec::Sparse("s", 4, adagrad, {InitializerKind::kUniform, -0.1f, 0.1f, 7});
  TableSpec s8 = TableSpec::Sparse("s8", 8, {OptimizerKind::kFtrl});
  s8.admission = {.min_count = 2, .probability = 0.5f};
  s8.eviction = {.max_idle_steps = 50, .max_idle_seconds = 0};
  TableSpec d = TableSpec::Dense("d", 40000, adam, {InitializerKind::kConstant, 0.5f, 0, 0});
  return {s, s8, d};
}

// Sets the exactly-once fields of a push where this build's Header has them.
template <typename H>
void SetClientSeq(H& h, uint64_t id, uint64_t seq) {
  if constexpr (requires {
                  h.client_id = id;
                  h.client_seq = seq;
                }) {
    h.client_id = id;
    h.client_seq = seq;
  }
}

// libFuzzer's timeout timer (SIGALRM) interrupts ZeroMQ calls now and then (EINTR), which
// cppzmq throws: such a call is made again.
template <typename F>
auto RetryOnEintr(F&& f) {
  for (;;) {
    try {
      return f();
    } catch (const zmq::error_t& e) {
      if (e.num() != EINTR) throw;
    }
  }
}

// The map the server follows (map mode), kept by the harness, with the slots the fuzzed
// server is the primary of and those it backs up.
struct FollowedMap {
  RoutingMap map;
  std::vector<uint32_t> owned, backed;
};
FollowedMap& Followed() {
  static FollowedMap f;
  return f;
}
const RoutingMap& CurrentMap() { return Followed().map; }
void SetCurrentMap(const RoutingMap& m) {
  FollowedMap& f = Followed();
  f.map = m;
  f.owned.clear();
  f.backed.clear();
  for (uint32_t slot = 0; slot < kNumSlots; ++slot) {
    if (m.primary.ServerOfSlot(slot) == kMapRank) f.owned.push_back(slot);
    if (slot < m.backup.size() && m.backup[slot] == kMapRank) f.backed.push_back(slot);
  }
}

// A key that the fuzzed server owns (or, `backed`, backs up in map mode): `k` itself when no
// slot qualifies, else a key of the (k mod n)-th such slot.
uint64_t OwnedKey(uint64_t k, bool backed = false) {
  if constexpr (kFollowMap) {
    const std::vector<uint32_t>& slots = backed ? Followed().backed : Followed().owned;
    if (slots.empty()) return k;
    const uint64_t slot = slots[k % slots.size()];
    return Unmix64((slot << 50) | (k & ((uint64_t{1} << 50) - 1)));
  } else {
    static const SlotMap map = SlotMap::Uniform(2);
    while (map.ServerOfKey(k) != 0) ++k;
    return k;
  }
}

// The fixed map of map mode, version 1 (see the file comment); `listen` is server 1's address.
RoutingMap InitialMap(const std::string& listen) {
  RoutingMap m;
  m.version = 1;
  m.addresses = {"inproc://tessera-fuzz-peer-0", listen, "inproc://tessera-fuzz-peer-2"};
  const SlotMap uniform = SlotMap::Uniform(3);
  m.primary = uniform;
  m.backup.resize(kNumSlots);
  m.importing.assign(kNumSlots, RoutingMap::kNotImporting);
  for (uint32_t slot = 0; slot < kNumSlots; ++slot) {
    const uint16_t p = uniform.ServerOfSlot(slot);
    m.backup[slot] = slot % 4 == 3 ? RoutingMap::kNoBackup : static_cast<uint16_t>((p + 1) % 3);
    if (p == kMapRank && slot % 8 == 5) m.importing[slot] = 0;
  }
  m.dense_servers = 3;
  m.dense_primary = {0, 1, 2};
  m.dense_backup = {1, 2, 0};
  return m;
}

// A map changed from `m` as the input says: a version step (0: the same version, ignored by
// the server, else newer), then up to 3 runs of slots given a new primary, backup and
// importing source among the three servers (kept consistent: a backup or source is never the
// primary), and whether dense parts keep their backups.
RoutingMap ChangedMap(const RoutingMap& m, fuzz::FuzzInput& in) {
  RoutingMap next = m;
  next.version = m.version + in.U8() % 3;
  std::vector<uint16_t> owners = m.primary.owners();
  const int runs = in.U8() % 4;
  for (int r = 0; r < runs; ++r) {
    const uint32_t start = in.U16() % kNumSlots;
    const uint32_t len = 1 + in.U16() % 4096;
    const uint16_t p = in.U8() % 3;
    const uint8_t b = in.U8() % 4, imp = in.U8() % 4;
    for (uint32_t slot = start; slot < std::min(kNumSlots, start + len); ++slot) {
      owners[slot] = p;
      next.backup[slot] = (b == 3 || b == p) ? RoutingMap::kNoBackup : b;
      next.importing[slot] = (imp == 3 || imp == p) ? RoutingMap::kNotImporting : imp;
    }
  }
  next.primary = *SlotMap::FromOwners(std::move(owners), 3);
  if (in.U8() & 1) next.dense_backup.assign(3, RoutingMap::kNoBackup);
  return next;
}

// Floats that hit the edges of the checks (hyper-parameters, gradients).
float Interesting(uint8_t i) {
  static const float kValues[] = {0.0f,  0.01f, 1.0f,   -1.0f, 0.9f,     0.999f,    1e-8f, 0.5f,
                                  -0.0f, 1e30f, -1e30f, 2.0f,  INFINITY, -INFINITY, NAN,   1e-45f};
  return kValues[i % std::size(kValues)];
}

TableSpec SpecFrom(fuzz::FuzzInput& in) {
  TableSpec s;
  s.name = std::string(in.Chunk());
  s.kind = static_cast<TableKind>(in.U8() % 3);
  const uint8_t wide = in.U8();
  s.dim = (wide & 1) ? in.U32() : in.U8() % 17;
  s.length = (wide & 2) ? in.U64() : in.U16();
  auto& o = s.optimizer;
  o.kind = static_cast<OptimizerKind>(in.U8() % 7);
  for (float* f : {&o.learning_rate, &o.momentum, &o.beta1, &o.beta2, &o.epsilon,
                   &o.initial_accumulator, &o.ftrl_beta, &o.l1, &o.l2}) {
    if (wide & 4) *f = Interesting(in.U8());
  }
  s.initializer.kind = static_cast<InitializerKind>(in.U8() % 5);
  s.initializer.a = Interesting(in.U8());
  s.initializer.b = Interesting(in.U8());
  s.initializer.seed = in.U8();
  if (wide & 8) {
    s.admission.min_count = in.U8() % 4;
    s.admission.probability = Interesting(in.U8());
    s.eviction.max_idle_steps = in.U8() % 4;
    s.eviction.max_idle_seconds = in.U8() % 2;
  }
  return s;
}

// A data frame for envelope `h`, shaped by `kind`: keys, values or raw bytes, of the size the
// envelope implies or one item off, with keys of this server or not, values finite or not.
std::string DataFrame(fuzz::FuzzInput& in, const Header& h) {
  const uint8_t kind = in.U8();
  const uint64_t count = std::min<uint64_t>(h.count, kMaxFrameItems);
  const bool dense = h.op == Op::kDensePull || h.op == Op::kDensePush;
  const uint64_t per = dense ? 1 : std::min<uint64_t>(h.dim, kMaxFrameItems);
  uint64_t n = (kind & 1) ? count : std::min<uint64_t>(count * per, 4 * kMaxFrameItems);
  if ((kind >> 6) == 1 && n > 0) --n;
  if ((kind >> 6) == 2) ++n;
  std::string out;
  switch ((kind >> 1) % 3) {
    case 0: {  // keys
      const uint64_t base = (kind & 8) ? in.U64() : in.U16();
      for (uint64_t i = 0; i < n; ++i) {
        const uint64_t k = (kind & 16) ? base + i : OwnedKey(base + i, kFollowMap && (kind & 32));
        out.append(reinterpret_cast<const char*>(&k), sizeof(k));
      }
      break;
    }
    case 1: {  // values
      std::vector<float> v(n);
      for (uint64_t i = 0; i < n; ++i) v[i] = 0.125f * static_cast<float>(i % 9) - 0.5f;
      if ((kind & 32) && n > 0) v[in.U16() % n] = Interesting(in.U8());
      out.assign(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
      break;
    }
    default:
      out = std::string(in.Chunk());
  }
  return out;
}

// A structured message: an envelope from fields of the input (each small and plausible, or
// full-width where the `wide` bits say), then its data frames.
std::vector<std::string> BuildStructured(fuzz::FuzzInput& in) {
  static const std::vector<TableSpec> tables = StartTables();
  Header h;
  h.op = static_cast<Op>(in.U8() % (kMaxOp + 2));
  h.request_id = in.U32();
  const uint8_t t = in.U8() % 5;
  const TableSpec* table = t < tables.size() ? &tables[t] : nullptr;
  h.table_id = table ? TableIdForName(table->name) : (t == 3 ? in.U64() : 0);
  h.elem_type = static_cast<ElemType>(in.U8() % 4);
  const uint8_t wide = in.U8();
  h.count = (wide & 1) ? in.U64() : in.U8() % 48;
  h.dim = (wide & 2) ? in.U32() : (table ? table->dim : in.U8() % 9);
  h.offset = (wide & 4) ? in.U64() : in.U16();
  h.worker_id = (wide & 8) ? in.U32() : in.U8() % 4;
  h.clock = (wide & 16) ? static_cast<int64_t>(in.U64()) : int64_t{in.U8() % 10} - 1;
  h.staleness = (wide & 32) ? static_cast<int32_t>(in.U32()) : int32_t{in.U8() % 4} - 1;
  h.num_workers = (wide & 64) ? in.U32() : in.U8() % 4;
  if (wide & 128) SetClientSeq(h, 1 + in.U8() % 3, in.U8() % 8);
  h.name = std::string(in.Chunk());
  if (h.op == Op::kCreateTable && (in.U8() & 1)) h.spec = SpecFrom(in);
  if constexpr (kFollowMap) {
    // The fencing fields: the server's version, one off either way, or any.
    const uint64_t v = CurrentMap().version;
    const uint8_t mv = in.U8();
    h.map_version = mv % 4 == 0 ? v : mv % 4 == 1 ? v - 1 : mv % 4 == 2 ? v + 1 : in.U64();
    const uint8_t from = in.U8();
    h.replica_from = from % 5 < 4 ? from % 5 : in.U32();
    const uint8_t origin = in.U8();
    h.client_origin = origin % 5 < 4 ? origin % 5 : in.U32();
  }
  std::vector<std::string> frames(1);
  EncodeHeader(h, &frames[0]);
  const int data_frames = in.U8() % 4;
  for (int f = 0; f < data_frames; ++f) frames.push_back(DataFrame(in, h));
  return frames;
}

// A raw message: frames as the input has them.
std::vector<std::string> BuildRaw(fuzz::FuzzInput& in, uint8_t tag) {
  std::vector<std::string> frames;
  const int n = 1 + tag % 4;
  for (int f = 0; f < n; ++f) frames.emplace_back(in.Chunk());
  return frames;
}

// One server and a peer that talks to it; this thread is the server's I/O thread.
class Harness {
 public:
  explicit Harness(const std::string& scratch) : admin_root_(scratch + "/admin") {
    FLAGS_minloglevel = 2;  // the server logs every checkpoint and restore at INFO
    Start();
  }

  void Run(const uint8_t* data, size_t size) {
    if (++inputs_ % kRestartEvery == 0) {
      Stop();
      Start();
    } else if (inputs_ % kMaintainEvery == 0) {
      (server_.get()->*Get(MaintainTag{}))();
    }
    fuzz::FuzzInput in(data, size);
    for (int m = 0; m < kMaxMessages && !in.empty(); ++m) {
      const uint8_t tag = in.U8();
      if (kFollowMap && tag == kMapTag) {
        const RoutingMap next = ChangedMap(CurrentMap(), in);
        if (server_->SetClusterMap(next).ok() && next.version > CurrentMap().version) {
          SetCurrentMap(next);
        }
        Pump();
        continue;
      }
      Send(tag >= 0x80 ? BuildStructured(in) : BuildRaw(in, tag));
    }
  }

 private:
  void Start() {
    ServerOptions o;
    o.listen = "inproc://tessera-fuzz-server";
    o.rank = kFollowMap ? kMapRank : 0;
    o.num_servers = kFollowMap ? 3 : 2;
    o.follow_cluster_map = kFollowMap;
    o.lanes = 2;
    o.max_request_bytes = 1 << 20;
    o.admin_root = admin_root_;
    server_ = std::make_unique<ServerImpl>(o);
    Status s = server_->Start();
    Check(s.ok(), "server start:", s.ToString());
    // Stop the I/O thread (it polls every 100 ms); from here on this thread is the I/O thread.
    IoThread& io = server_.get()->*Get(IoThreadTag{});
    io.stop.store(true);
    io.thread.join();
    peer_ = std::make_unique<zmq::socket_t>(server_.get()->*Get(ContextTag{}),
                                            zmq::socket_type::dealer);
    peer_->set(zmq::sockopt::linger, 0);
    peer_->connect(o.listen);
    if constexpr (kFollowMap) {
      SetCurrentMap(InitialMap(o.listen));
      for (uint32_t id : {0u, 2u}) {
        auto& r = other_servers_.emplace_back(server_.get()->*Get(ContextTag{}),
                                              zmq::socket_type::router);
        r.set(zmq::sockopt::linger, 0);
        r.bind(CurrentMap().addresses[id]);
      }
      Status s = server_->SetClusterMap(CurrentMap());
      Check(s.ok(), "the initial map:", s.ToString());
    }
    std::error_code ec;
    std::filesystem::create_directories(admin_root_, ec);
    for (const TableSpec& t : StartTables()) {
      Header h;
      h.op = Op::kCreateTable;
      h.spec = t;
      std::vector<std::string> frames(1);
      EncodeHeader(h, &frames[0]);
      Send(frames);
    }
  }

  void Stop() {
    peer_.reset();
    other_servers_.clear();
    server_->Shutdown();
    server_.reset();
    sent_ids_.clear();
    checkpoints_.clear();
    std::error_code ec;
    std::filesystem::remove_all(admin_root_, ec);
  }

  void Send(const std::vector<std::string>& frames) {
    Header as_sent;  // what the server will decode: its reply carries this request id
    (void)DecodeHeader(frames[0].data(), frames[0].size(), &as_sent);
    sent_ids_.insert(as_sent.request_id);
    if (as_sent.op == Op::kCheckpoint) checkpoints_[as_sent.request_id] = as_sent.name;
    Check(RetryOnEintr([&] {
            std::vector<zmq::message_t> parts;
            for (const auto& f : frames) parts.emplace_back(f.data(), f.size());
            return zmq::send_multipart(*peer_, parts, zmq::send_flags::dontwait).has_value();
          }),
          "the peer could not send");
    Pump();
  }

  // One turn of the I/O thread: receive, pass on the lanes' replies, answer what the server
  // forwarded to the other servers (map mode), read the replies.
  void Pump() {
    for (int turn = 0; turn < 2; ++turn) {
      (server_.get()->*Get(ReceiveBurstTag{}))();
      (server_.get()->*Get(ForwardRepliesTag{}))();
      if (!AnswerForwarded()) break;
    }
    DrainReplies();
  }

  // The other servers of map mode answer each request the fuzzed server sent them (a forwarded
  // push to its backup, a copy's request): OK, except every 7th, which is refused as stale.
  // Returns whether any was answered.
  bool AnswerForwarded() {
    bool any = false;
    for (auto& r : other_servers_) {
      for (;;) {
        std::vector<zmq::message_t> msg;
        const bool got = RetryOnEintr([&] {
          msg.clear();
          return zmq::recv_multipart(r, std::back_inserter(msg), zmq::recv_flags::dontwait)
              .has_value();
        });
        if (!got) break;
        Header h;
        if (msg.size() < 2 || !DecodeHeader(msg[1].data(), msg[1].size(), &h).ok()) continue;
        any = true;
        if (++forwarded_ % 7 == 0) {
          h.status = StatusCode::kFailedPrecondition;
          h.message = "stale cluster map (fuzz harness)";
        } else {
          h.status = StatusCode::kOk;
        }
        std::string env;
        EncodeHeader(h, &env);
        std::vector<zmq::message_t> reply;
        reply.emplace_back(msg[0].data(), msg[0].size());
        reply.emplace_back(env.data(), env.size());
        (void)RetryOnEintr([&] {
          return zmq::send_multipart(r, reply, zmq::send_flags::dontwait).has_value();
        });
      }
    }
    return any;
  }

  void DrainReplies() {
    for (;;) {
      std::vector<zmq::message_t> reply;
      const bool got = RetryOnEintr([&] {
        reply.clear();
        return zmq::recv_multipart(*peer_, std::back_inserter(reply), zmq::recv_flags::dontwait)
            .has_value();
      });
      if (!got) return;
      Header r;
      Status s = DecodeHeader(reply[0].data(), reply[0].size(), &r);
      Check(s.ok(), "a reply that does not decode:", s.ToString());
      Check(sent_ids_.contains(r.request_id),
            "a reply to a request id never sent:", std::to_string(r.request_id));
      if (r.status != StatusCode::kOk) {
        Check(!r.message.empty(), "an error reply without a message, op",
              std::string(OpName(r.op)));
      } else if (r.op == Op::kCheckpoint) {
        // What Client::Checkpoint adds once every server answered: the fuzzer may restore it.
        auto it = checkpoints_.find(r.request_id);
        if (it != checkpoints_.end() && ValidateAdminName(it->second).ok()) {
          (void)fuzz::WriteScratchFile(admin_root_ + "/" + it->second + "/CHECKPOINT",
                                       "tessera checkpoint\n");
        }
      }
    }
  }

  const std::string admin_root_;
  std::unique_ptr<ServerImpl> server_;
  std::unique_ptr<zmq::socket_t> peer_;
  std::deque<zmq::socket_t> other_servers_;  // map mode: servers 0 and 2
  uint64_t forwarded_ = 0;
  uint64_t inputs_ = 0;
  std::unordered_set<uint64_t> sent_ids_;
  absl::flat_hash_map<uint64_t, std::string> checkpoints_;
};

}  // namespace
}  // namespace tessera::internal

// The server keeps what earlier inputs created (rows, tables, parked requests): memory that
// lives on past an input is no leak, and LeakSanitizer's check after every such input made the
// target 4x slower. -detect_leaks=0 is added unless the command line sets it.
extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  static std::vector<char*> args(*argv, *argv + *argc);
  static char no_leaks[] = "-detect_leaks=0";
  for (char* a : args) {
    if (std::string_view(a).starts_with("-detect_leaks=")) return 0;
  }
  args.insert(args.end(), no_leaks);
  args.push_back(nullptr);
  *argc = static_cast<int>(args.size()) - 1;
  *argv = args.data();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The scratch directory goes at exit; the server lives until the process is gone (stopping
  // its threads during static destruction would race with the libraries' own teardown).
  static tessera::fuzz::ScratchDir scratch(tessera::internal::kFollowMap ? "server_map"
                                                                         : "server_request");
  static auto* harness = new tessera::internal::Harness(scratch.path());
  harness->Run(data, size);
  return 0;
}
