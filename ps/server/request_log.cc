#include <glog/logging.h>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <thread>

#include "ps/routing.h"
#include "ps/server/request_log_internal.h"
#include "ps/thread_name_internal.h"

namespace tessera::internal {

std::array<char, RequestLog::kHeaderBytes> RequestLog::EncodeHeader(const Pending& p) {
  const Header& h = p.header;
  std::array<char, kHeaderBytes> e{};
  char* d = e.data();
  d[0] = h.op != Op::kDensePush ? 5 : 6;
  const uint32_t dim = h.dim;
  std::memcpy(d + 4, &dim, 4);
  std::memcpy(d + 8, &h.table_id, 8);
  std::memcpy(d + 16, &h.count, 8);
  std::memcpy(d + 24, &h.offset, 8);
  std::memcpy(d + 32, &h.client_id, 8);
  std::memcpy(d + 40, &h.client_seq, 8);
  std::memcpy(d + 48, &h.lr_scale, 4);
  return e;
}

uint64_t RequestLog::Stage(std::shared_ptr<Pending> p) {
  const Header& h = p->header;
  const bool sparse = h.op != Op::kDensePush;
  const uint64_t floats = sparse ? h.count * h.dim : h.count;
  Staged& st = staged_.emplace_back();
  st.header = EncodeHeader(*p);
  // The keys and gradients go to the log straight from the request's frames.
  st.parts = {std::string_view(st.header.data(), st.header.size()),
              std::string_view(reinterpret_cast<const char*>(p->keys), sparse ? h.count * 8 : 0),
              std::string_view(reinterpret_cast<const char*>(p->values), floats * 4)};
  st.p = std::move(p);
  return ++seq_;
}

Status RequestLog::WriteStaged() {
  if (staged_.empty()) return Status::OK();
  std::vector<LogEntry> entries;
  entries.reserve(staged_.size());
  const uint64_t first = seq_ + 1 - staged_.size();
  for (size_t i = 0; i < staged_.size(); ++i) {
    // The header array moved with the vector's growth: point at it again.
    staged_[i].parts[0] = std::string_view(staged_[i].header.data(), kHeaderBytes);
    entries.push_back(LogEntry{first + i, staged_[i].parts});
  }
  Status s = engine_->AppendLogGroup(entries);
  if (!s.ok()) seq_ = first - 1;
  staged_.clear();
  return s.ok() ? s : s.WithContext("logging the push");
}

RequestLog::~RequestLog() {
  {
    MutexLock l(truncate_mu_);
    truncate_stop_ = true;
  }
  truncate_cv_.notify_one();
  if (truncator_.joinable()) truncator_.join();
}

Status RequestLog::StoreMarksAndTruncate(uint64_t mark, const std::string& marks) {
  // The entries about to go hold the only durable copy of their clients' push marks.
  TESSERA_RETURN_IF_ERROR(engine_->PutMeta("server/clients", marks));
  return engine_->TruncateLog(mark);
}

void RequestLog::TruncateTo(uint64_t mark) {
  if (!engine_->durable()) return;
  mark = std::min(mark, seq_);
  if (mark <= truncated_.load(std::memory_order_acquire)) return;
  {
    MutexLock l(truncate_mu_);
    if (truncate_busy_ && mark <= truncate_mark_) return;  // that much is on its way
    truncate_busy_ = truncate_pending_ = true;
    truncate_mark_ = mark;
    truncate_marks_ = dedup_->Encode();  // the I/O thread's table, read here
    if (!truncator_.joinable()) truncator_ = std::thread([this] { TruncateLoop(); });
  }
  truncate_cv_.notify_one();
}

void RequestLog::TruncateLoop() {
  NameThisThread("log-truncate");
  MutexLock l(truncate_mu_);
  for (;;) {
    while (!truncate_stop_ && !truncate_pending_) truncate_cv_.wait(l.native());
    if (!truncate_pending_) return;  // stopping, nothing asked
    truncate_pending_ = false;
    const uint64_t mark = truncate_mark_;
    const std::string marks = std::move(truncate_marks_);
    l.Unlock();
    const Status s = StoreMarksAndTruncate(mark, marks);
    l.Lock();
    if (s.ok()) {
      truncated_.store(std::max(truncated_.load(std::memory_order_relaxed), mark),
                       std::memory_order_release);
    } else {
      LOG(WARNING) << "truncating the request log: " << s.ToString();
    }
    // A later mark asked meanwhile is still to do; otherwise the next TruncateTo asks again.
    truncate_busy_ = truncate_pending_;
  }
}

Result<std::vector<uint64_t>> RequestLog::ReadMarks(
    const std::vector<std::unique_ptr<LaneStore>>& stores) {
  const uint32_t nl = static_cast<uint32_t>(stores.size());
  uint32_t old_lanes = nl;
  TESSERA_ASSIGN_OR_RETURN(auto stored_lanes, engine_->GetMeta("server/lanes"));
  if (stored_lanes) {
    TESSERA_ASSIGN_OR_RETURN(uint64_t n, ParseStoredNumber(*stored_lanes, "server/lanes", 256));
    if (n == 0) return Status::Corruption("server/lanes is 0");
    old_lanes = static_cast<uint32_t>(n);
  }
  std::vector<uint64_t> marks(old_lanes, 0);
  for (uint32_t l = 0; l < old_lanes; ++l) {
    if (old_lanes == nl) {
      marks[l] = stores[l]->committed_seq();
      continue;
    }
    TESSERA_ASSIGN_OR_RETURN(auto m, engine_->GetMeta("storage/lane/" + std::to_string(old_lanes) +
                                                      "/" + std::to_string(l)));
    uint64_t seq = 0;
    if (m && m->size() == 8) {
      for (char c : *m) seq = (seq << 8) | static_cast<uint8_t>(c);
    }
    marks[l] = seq;
  }
  other_layouts_.clear();
  TESSERA_RETURN_IF_ERROR(engine_->ScanMeta(
      "storage/lane/", [&](std::string_view key, std::string_view value) {
        // "storage/lane/<lanes>/<lane>": an 8-byte big-endian mark.
        const std::string_view rest = key.substr(std::string_view("storage/lane/").size());
        const size_t slash = rest.find('/');
        if (slash == std::string_view::npos || value.size() != 8) return;
        uint32_t n = 0, l = 0;
        if (std::from_chars(rest.data(), rest.data() + slash, n).ec != std::errc() ||
            std::from_chars(rest.data() + slash + 1, rest.data() + rest.size(), l).ec !=
                std::errc() ||
            n == 0 || n > 256 || l >= n || n == old_lanes) {
          return;
        }
        uint64_t seq = 0;
        for (char ch : value) seq = (seq << 8) | static_cast<uint8_t>(ch);
        auto it = std::find_if(other_layouts_.begin(), other_layouts_.end(),
                               [&](const auto& layout) { return layout.first == n; });
        if (it == other_layouts_.end()) {
          other_layouts_.emplace_back(n, std::vector<uint64_t>(n, 0));
          it = other_layouts_.end() - 1;
        }
        it->second[l] = seq;
      }));
  return marks;
}

namespace {

// A request-log entry's header, checked against the entry's size; `body` is what follows it.
struct EntryHeader {
  uint32_t dim = 0;
  uint64_t table = 0, count = 0, offset = 0, client = 0, client_seq = 0;
  float lr_scale = 1.0f;
  bool sparse = false;
  const char* body = nullptr;
};

Result<EntryHeader> ParseEntry(uint64_t seq, std::string_view e) {
  const char kind = e.empty() ? 0 : e[0];
  const size_t header = kind >= 5   ? RequestLog::kHeaderBytes
                        : kind >= 3 ? RequestLog::kClientHeaderBytes
                                    : RequestLog::kOldHeaderBytes;
  if (kind < 1 || kind > 6 || e.size() < header) {
    return Status::Corruption("malformed request-log entry " + std::to_string(seq));
  }
  EntryHeader h;
  std::memcpy(&h.dim, e.data() + 4, 4);
  std::memcpy(&h.table, e.data() + 8, 8);
  std::memcpy(&h.count, e.data() + 16, 8);
  std::memcpy(&h.offset, e.data() + 24, 8);
  if (header >= RequestLog::kClientHeaderBytes) {
    std::memcpy(&h.client, e.data() + 32, 8);
    std::memcpy(&h.client_seq, e.data() + 40, 8);
  }
  if (header == RequestLog::kHeaderBytes) std::memcpy(&h.lr_scale, e.data() + 48, 4);
  h.sparse = kind % 2 == 1;
  h.body = e.data() + header;
  if (!(h.lr_scale >= 0.0f && h.lr_scale <= kMaxLrScale)) {
    return Status::Corruption("request-log entry " + std::to_string(seq) +
                              " has learning-rate scale " + std::to_string(h.lr_scale));
  }
  if (h.dim > (1u << 20) || h.count > (uint64_t{1} << 40)) {
    return Status::Corruption("request-log entry " + std::to_string(seq) + " has dim " +
                              std::to_string(h.dim) + " and count " + std::to_string(h.count));
  }
  const uint64_t want =
      header + (h.sparse ? h.count * 8 + h.count * h.dim * 4 : h.count * 4);
  if (e.size() != want) {
    return Status::Corruption("request-log entry " + std::to_string(seq) + " has " +
                              std::to_string(e.size()) + " bytes, expected " +
                              std::to_string(want));
  }
  return h;
}

}  // namespace

Status RequestLog::ApplyEntry(uint64_t seq, std::string_view e, const std::vector<uint64_t>& marks,
                              std::vector<std::unique_ptr<LaneStore>>& stores,
                              const std::function<bool(uint64_t)>& known,
                              ReplayThread& thread) {
  TESSERA_ASSIGN_OR_RETURN(const EntryHeader h, ParseEntry(seq, e));
  const uint32_t dim = h.dim;
  const uint64_t table = h.table, count = h.count;
  if (thread.note_client) dedup_->Logged(h.client, h.client_seq);
  if (!known(table)) return Status::OK();  // a table that no longer exists
  // Every lane holds this entry already: it was read for its client mark only.
  if (seq <= *std::min_element(marks.begin(), marks.end())) return Status::OK();
  const char* d = h.body;
  if (h.sparse) {
    thread.keys.resize(count);  // copied: an entry's keys need not be 8-byte aligned
    std::memcpy(thread.keys.data(), d, count * 8);
    d += count * 8;
  }
  const size_t floats = h.sparse ? count * dim : count;
  const float* grads = reinterpret_cast<const float*>(d);
  if (reinterpret_cast<uintptr_t>(d) % alignof(float) != 0) {
    thread.grads.resize(floats);
    std::memcpy(thread.grads.data(), d, floats * 4);
    grads = thread.grads.data();
  }
  const std::vector<bool>& mine = thread.mine;
  const uint32_t nl = static_cast<uint32_t>(stores.size());
  const uint32_t old_lanes = static_cast<uint32_t>(marks.size());
  const ApplyContext ctx{0, NowSeconds(), h.lr_scale};
  if (!h.sparse) {
    DenseSplit split = SplitDenseByLane(table, h.offset, count, nl);
    for (uint32_t l = 0; l < nl; ++l) {
      if (!mine[l]) continue;
      for (const DenseSegment& s : split[l]) {
        if (seq <= marks[LaneOfChunk(table, s.chunk, old_lanes)] ||
            OtherLayoutHas(seq, [&](uint32_t n) { return LaneOfChunk(table, s.chunk, n); })) {
          continue;
        }
        TESSERA_RETURN_IF_ERROR(
            stores[l]->DenseApply(table, s.chunk, s.begin, s.end, grads + s.pos, ctx));
      }
    }
    return Status::OK();
  }
  const uint64_t* keys = thread.keys.data();
  (void)SplitKeysByLane(keys, count, nl, nullptr, 0, &thread.split);
  std::vector<uint64_t>& k = thread.k;
  std::vector<const float*>& g = thread.g;
  for (uint32_t l = 0; l < nl; ++l) {
    if (!mine[l]) continue;
    k.clear();
    g.clear();
    for (uint32_t i : thread.split[l]) {
      const uint32_t slot = SlotOfKey(keys[i]);
      if (seq <= marks[LaneOfSlot(slot, old_lanes)] ||
          OtherLayoutHas(seq, [&](uint32_t n) { return LaneOfSlot(slot, n); })) {
        continue;
      }
      k.push_back(keys[i]);
      g.push_back(grads + size_t{i} * dim);
    }
    if (!k.empty()) TESSERA_RETURN_IF_ERROR(stores[l]->Apply(table, k, g, ctx));
  }
  return Status::OK();
}

Status RequestLog::Replay(std::vector<std::unique_ptr<LaneStore>>& stores,
                          const std::function<bool(uint64_t)>& known) {
  if (!engine_->durable()) return Status::OK();
  TESSERA_ASSIGN_OR_RETURN(auto stored_clients, engine_->GetMeta("server/clients"));
  if (stored_clients) {
    TESSERA_RETURN_IF_ERROR(dedup_->Merge(*stored_clients).WithContext("server/clients"));
  }
  TESSERA_ASSIGN_OR_RETURN(std::vector<uint64_t> marks, ReadMarks(stores));
  const uint64_t from = *std::min_element(marks.begin(), marks.end());
  uint64_t last = *std::max_element(marks.begin(), marks.end());
  for (auto& s : stores) last = std::max(last, s->committed_seq());
  // From the start of what the log kept, not from the lowest mark: the entries at or below the
  // marks may hold client marks newer than the stored "server/clients" record (rows become
  // durable before the next truncation stores it), and a retried push must still be known.
  // Lanes replay in parallel (each reads the log and applies its own keys: replay is mostly
  // reading rows back from RocksDB into an empty memory tier); thread 0 notes the clients.
  const uint32_t nl = static_cast<uint32_t>(stores.size());
  const uint32_t threads = std::max(1u, std::min(nl, std::thread::hardware_concurrency()));
  std::vector<Status> status(threads);
  std::vector<uint64_t> lasts(threads, last), counts(threads, 0);
  auto run = [&](uint32_t t) {
    ReplayThread thread;
    thread.mine.assign(nl, false);
    for (uint32_t l = t; l < nl; l += threads) thread.mine[l] = true;
    thread.note_client = t == 0;
    status[t] = engine_->ScanLog(0, [&](uint64_t seq, std::string_view e) -> Status {
      lasts[t] = std::max(lasts[t], seq);
      TESSERA_RETURN_IF_ERROR(ApplyEntry(seq, e, marks, stores, known, thread));
      if (seq > from) ++counts[t];
      return Status::OK();
    });
  };
  std::vector<std::thread> helpers;
  for (uint32_t t = 1; t < threads; ++t) helpers.emplace_back(run, t);
  run(0);
  for (auto& h : helpers) h.join();
  for (const Status& st : status) TESSERA_RETURN_IF_ERROR(st);
  last = *std::max_element(lasts.begin(), lasts.end());
  const uint64_t replayed = counts[0];
  for (auto& s : stores) s->SetAppliedSeq(last);
  uint64_t durable = from;
  if (marks.size() != stores.size()) {
    // A new lane layout: its marks must cover everything before "server/lanes" says so, or a
    // crash now would replay entries the old lanes had already applied.
    for (auto& s : stores) TESSERA_RETURN_IF_ERROR(s->Commit());
    durable = last;
  }
  TESSERA_RETURN_IF_ERROR(engine_->PutMeta("server/lanes", std::to_string(stores.size())));
  // Otherwise the replayed rows stay dirty and go out with the lanes' first write-back: the
  // server serves without waiting for them (the log keeps them until then).
  TESSERA_RETURN_IF_ERROR(StoreMarksAndTruncate(durable, dedup_->Encode()));
  seq_ = last;
  truncated_.store(durable, std::memory_order_release);
  if (replayed > 0) {
    LOG(INFO) << "replayed " << replayed << " request-log entries (up to " << last << ")";
  }
  return Status::OK();
}

}  // namespace tessera::internal
