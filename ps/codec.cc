#include "ps/codec.h"

#include <flatbuffers/flatbuffers.h>

#include "schema/tessera_generated.h"

namespace tessera {

namespace fb = ::tessera::wire;

std::string_view OpName(Op op) {
  switch (op) {
    case Op::kInvalid:
      return "Invalid";
    case Op::kPing:
      return "Ping";
    case Op::kCreateTable:
      return "CreateTable";
    case Op::kGetTable:
      return "GetTable";
    case Op::kSparsePull:
      return "SparsePull";
    case Op::kSparsePush:
      return "SparsePush";
    case Op::kSparsePushPull:
      return "SparsePushPull";
    case Op::kDensePull:
      return "DensePull";
    case Op::kDensePush:
      return "DensePush";
    case Op::kClock:
      return "Clock";
    case Op::kBarrier:
      return "Barrier";
    case Op::kPutMeta:
      return "PutMeta";
    case Op::kGetMeta:
      return "GetMeta";
    case Op::kStats:
      return "Stats";
    case Op::kCheckpoint:
      return "Checkpoint";
    case Op::kRestore:
      return "Restore";
    case Op::kExport:
      return "Export";
    case Op::kSlotExport:
      return "SlotExport";
    case Op::kSlotImport:
      return "SlotImport";
    case Op::kSlotDrop:
      return "SlotDrop";
    case Op::kDropTable:
      return "DropTable";
  }
  return "Unknown";
}

namespace {

flatbuffers::Offset<fb::TableSpec> BuildSpec(flatbuffers::FlatBufferBuilder& b,
                                             const TableSpec& s) {
  auto name = b.CreateString(s.name);
  const auto& o = s.optimizer;
  auto opt =
      fb::CreateOptimizerSpec(b, static_cast<uint8_t>(o.kind), o.learning_rate, o.momentum, o.beta1,
                              o.beta2, o.epsilon, o.initial_accumulator, o.ftrl_beta, o.l1, o.l2);
  const auto& i = s.initializer;
  auto init = fb::CreateInitializerSpec(b, static_cast<uint8_t>(i.kind), i.a, i.b, i.seed);
  return fb::CreateTableSpec(b, name, static_cast<uint8_t>(s.kind), s.dim, s.length, opt, init,
                             s.admission.min_count, s.admission.probability,
                             s.eviction.max_idle_steps, s.eviction.max_idle_seconds);
}

TableSpec ReadSpec(const fb::TableSpec& f) {
  TableSpec s;
  if (f.name()) s.name = f.name()->str();
  s.kind = static_cast<TableKind>(f.kind());
  s.dim = f.dim();
  s.length = f.length();
  if (const auto* o = f.optimizer()) {
    s.optimizer.kind = static_cast<OptimizerKind>(o->kind());
    s.optimizer.learning_rate = o->learning_rate();
    s.optimizer.momentum = o->momentum();
    s.optimizer.beta1 = o->beta1();
    s.optimizer.beta2 = o->beta2();
    s.optimizer.epsilon = o->epsilon();
    s.optimizer.initial_accumulator = o->initial_accumulator();
    s.optimizer.ftrl_beta = o->ftrl_beta();
    s.optimizer.l1 = o->l1();
    s.optimizer.l2 = o->l2();
  }
  if (const auto* i = f.initializer()) {
    s.initializer.kind = static_cast<InitializerKind>(i->kind());
    s.initializer.a = i->a();
    s.initializer.b = i->b();
    s.initializer.seed = i->seed();
  }
  s.admission.min_count = f.admission_min_count();
  s.admission.probability = f.admission_probability();
  s.eviction.max_idle_steps = f.eviction_max_idle_steps();
  s.eviction.max_idle_seconds = f.eviction_max_idle_seconds();
  return s;
}

}  // namespace

void EncodeHeader(const Header& h, std::string* out) {
  flatbuffers::FlatBufferBuilder b(128 + h.message.size() + h.name.size());
  flatbuffers::Offset<flatbuffers::String> message, name;
  flatbuffers::Offset<fb::TableSpec> spec;
  if (!h.message.empty()) message = b.CreateString(h.message);
  if (!h.name.empty()) name = b.CreateString(h.name);
  if (h.spec) spec = BuildSpec(b, *h.spec);
  fb::EnvelopeBuilder e(b);
  e.add_version(h.version);
  e.add_request_id(h.request_id);
  e.add_op(static_cast<fb::Op>(h.op));
  e.add_table_id(h.table_id);
  e.add_elem_type(static_cast<fb::ElemType>(h.elem_type));
  e.add_count(h.count);
  e.add_dim(h.dim);
  e.add_offset(h.offset);
  e.add_worker_id(h.worker_id);
  e.add_clock(h.clock);
  e.add_staleness(h.staleness);
  e.add_num_workers(h.num_workers);
  e.add_status(static_cast<uint8_t>(h.status));
  if (h.client_id != 0) {
    e.add_client_id(h.client_id);
    e.add_client_seq(h.client_seq);
  }
  e.add_lr_scale(h.lr_scale);  // not written when 1 (the schema's default)
  e.add_map_version(h.map_version);  // not written when 0: static-cluster envelopes keep their size
  e.add_client_origin(h.client_origin);  // 0 (not written) but after a fail-over
  e.add_replica_from(h.replica_from);    // 0 (not written) but between replicas
  if (!h.message.empty()) e.add_message(message);
  if (h.spec) e.add_spec(spec);
  if (!h.name.empty()) e.add_name(name);
  b.Finish(e.Finish());
  out->assign(reinterpret_cast<const char*>(b.GetBufferPointer()), b.GetSize());
}

Status DecodeHeader(const void* data, size_t size, Header* out) {
  if (size == 0) return Status::InvalidArgument("empty envelope frame");
  if (size > kMaxEnvelopeBytes) {
    return Status::InvalidArgument("envelope of " + std::to_string(size) +
                                   " bytes exceeds the limit of " +
                                   std::to_string(kMaxEnvelopeBytes));
  }
  // FlatBuffers needs aligned access for scalars; envelopes are small, so copy if misaligned.
  std::string aligned;
  const uint8_t* p = static_cast<const uint8_t*>(data);
  if (reinterpret_cast<uintptr_t>(p) % 8 != 0) {
    aligned.assign(reinterpret_cast<const char*>(p), size);
    p = reinterpret_cast<const uint8_t*>(aligned.data());
  }
  // Bounded: at most 8 levels of nesting and 16 tables (an envelope has 4).
  flatbuffers::Verifier v(p, size, /*max_depth=*/8, /*max_tables=*/16);
  if (!fb::VerifyEnvelopeBuffer(v)) {
    return Status::InvalidArgument("envelope failed FlatBuffers verification (" +
                                   std::to_string(size) + " bytes)");
  }
  const fb::Envelope* e = fb::GetEnvelope(p);
  Header h;
  h.version = e->version();
  h.request_id = e->request_id();
  h.op = static_cast<Op>(e->op());
  h.table_id = e->table_id();
  h.elem_type = static_cast<ElemType>(e->elem_type());
  h.count = e->count();
  h.dim = e->dim();
  h.offset = e->offset();
  h.worker_id = e->worker_id();
  h.clock = e->clock();
  h.staleness = e->staleness();
  h.num_workers = e->num_workers();
  h.status = static_cast<StatusCode>(e->status());
  h.client_id = e->client_id();
  h.client_seq = e->client_seq();
  h.lr_scale = e->lr_scale();
  h.map_version = e->map_version();
  h.client_origin = e->client_origin();
  h.replica_from = e->replica_from();
  if (e->message()) h.message = e->message()->str();
  if (e->spec()) h.spec = ReadSpec(*e->spec());
  if (e->name()) h.name = e->name()->str();
  *out = std::move(h);
  if (out->version != kProtocolVersion) {
    return Status::FailedPrecondition("protocol version mismatch: peer speaks " +
                                      std::to_string(out->version) + ", this build speaks " +
                                      std::to_string(kProtocolVersion));
  }
  // Op Invalid appears only in error replies to requests whose op could not be read.
  if (static_cast<uint8_t>(out->op) > kMaxOp ||
      (out->op == Op::kInvalid && out->status == StatusCode::kOk)) {
    return Status::InvalidArgument("unknown op " + std::to_string(static_cast<int>(out->op)));
  }
  if (static_cast<uint8_t>(out->elem_type) > static_cast<uint8_t>(ElemType::kBytes)) {
    return Status::InvalidArgument("unknown element type " +
                                   std::to_string(static_cast<int>(out->elem_type)));
  }
  if (static_cast<uint8_t>(out->status) > static_cast<uint8_t>(StatusCode::kAborted)) {
    return Status::InvalidArgument("unknown status code");
  }
  return Status::OK();
}

std::string EncodeTableSpec(const TableSpec& spec) {
  Header h;
  h.op = Op::kCreateTable;
  h.spec = spec;
  std::string out;
  EncodeHeader(h, &out);
  return out;
}

Result<TableSpec> DecodeTableSpec(std::string_view bytes) {
  Header h;
  TESSERA_RETURN_IF_ERROR(DecodeHeader(bytes.data(), bytes.size(), &h));
  if (!h.spec) return Status::Corruption("stored table spec record has no spec");
  return *h.spec;
}

}  // namespace tessera
