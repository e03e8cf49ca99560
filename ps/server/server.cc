#include "ps/server.h"

#include <absl/container/flat_hash_map.h>
#include <glog/logging.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "ps/codec.h"
#include "ps/optimizer.h"
#include "ps/routing.h"
#include "ps/snapshot_internal.h"
#include "ps/table_spec.h"

namespace tessera {
namespace internal {
namespace {

uint32_t NowSeconds() {
  return static_cast<uint32_t>(std::chrono::duration_cast<std::chrono::seconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

// A request being served. Shared by the lane tasks it was split into; the last task to finish
// sends the reply.
struct Pending {
  zmq::message_t identity;
  Header header;
  std::vector<zmq::message_t> frames;
  // Typed, aligned views of the frames (the frames themselves, or copies if misaligned).
  const uint64_t* keys = nullptr;
  const float* values = nullptr;
  std::vector<uint64_t> key_copy;
  std::vector<float> value_copy;
  // Reply data frame, written in place by the lanes.
  zmq::message_t out;
  bool has_out = false;
  std::atomic<uint32_t> remaining{0};
  std::mutex mu;
  Status status;                  // first error; guarded by mu
  std::vector<std::string> text;  // per-lane text (Stats); guarded by mu
  bool silent = false;            // internal work (maintenance): no reply

  void Fail(const Status& s) {
    std::lock_guard<std::mutex> l(mu);
    if (status.ok()) status = s;
  }
};

// Sends the reply of a finished request over `sock` (an inproc PUSH to the I/O thread).
void SendReply(zmq::socket_t& sock, Pending& p) {
  Header h;
  h.request_id = p.header.request_id;
  h.op = p.header.op;
  h.table_id = p.header.table_id;
  h.worker_id = p.header.worker_id;
  h.status = p.status.code();
  h.message = p.status.message();
  std::vector<zmq::message_t> parts;
  parts.push_back(std::move(p.identity));
  std::string text;
  if (p.status.ok() && !p.text.empty()) {
    // Text can outgrow an envelope (a line per table): it travels as a data frame.
    for (auto& t : p.text) text += t;
    h.elem_type = ElemType::kBytes;
    h.count = 1;
  }
  std::string env;
  if (p.status.ok() && p.has_out) {
    h.elem_type = ElemType::kF32;
    h.count = p.header.count;
    h.dim = p.header.dim;
    h.offset = p.header.offset;
  }
  EncodeHeader(h, &env);
  parts.emplace_back(env.data(), env.size());
  if (p.status.ok() && p.has_out) parts.push_back(std::move(p.out));
  if (!text.empty()) parts.emplace_back(text.data(), text.size());
  zmq::send_multipart(sock, parts);
}

// Writes files off the lanes (checkpoint snapshots): write and fsync, then complete the
// request. Its own PUSH socket carries the reply when it finishes a request last.
class FileWriter {
 public:
  FileWriter(zmq::context_t& ctx, const std::string& reply_endpoint)
      : push_(ctx, zmq::socket_type::push) {
    push_.set(zmq::sockopt::sndhwm, 0);
    push_.set(zmq::sockopt::linger, 0);
    push_.connect(reply_endpoint);
    thread_ = std::thread([this] { Loop(); });
  }
  ~FileWriter() { Stop(); }

  void Submit(std::shared_ptr<Pending> p, std::string path, std::shared_ptr<std::string> data) {
    {
      std::lock_guard<std::mutex> l(mu_);
      jobs_.push_back(Job{std::move(p), std::move(path), std::move(data)});
    }
    cv_.notify_one();
  }
  void Stop() {
    {
      std::lock_guard<std::mutex> l(mu_);
      if (stop_) return;
      stop_ = true;
    }
    cv_.notify_one();
    if (thread_.joinable()) thread_.join();
    push_.close();
  }

 private:
  struct Job {
    std::shared_ptr<Pending> pending;
    std::string path;
    std::shared_ptr<std::string> data;
  };
  void Loop() {
    for (;;) {
      Job job;
      {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [&] { return stop_ || !jobs_.empty(); });
        if (jobs_.empty()) return;  // stopping, nothing left
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      Status s = WriteFileDurably(job.path, *job.data);
      job.data.reset();
      if (!s.ok()) job.pending->Fail(s);
      if (job.pending->remaining.fetch_sub(1, std::memory_order_acq_rel) == 1 &&
          !job.pending->silent) {
        SendReply(push_, *job.pending);
      }
    }
  }
  zmq::socket_t push_;  // writer thread only
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;  // guarded by mu_
  bool stop_ = false;     // guarded by mu_
};

class Lane;
struct Task {
  std::shared_ptr<Pending> pending;
  std::function<Status(Lane&)> run;
  bool writes = false;
  // Request-log sequence number this task completes for its lane (0: none).
  uint64_t seq = 0;
};

// One executor thread owning the rows of its slots.
class Lane {
 public:
  // `commit_interval_ms` > 0: rows of logged pushes are committed at most that often (the
  // request log already holds them durably); 0: every batch commits before it is answered.
  Lane(uint32_t index, std::unique_ptr<LaneStore> store, zmq::context_t& ctx,
       const std::string& reply_endpoint, uint32_t commit_interval_ms)
      : index_(index),
        store_(std::move(store)),
        push_(ctx, zmq::socket_type::push),
        commit_interval_(std::chrono::milliseconds(commit_interval_ms)) {
    push_.set(zmq::sockopt::sndhwm, 0);
    push_.set(zmq::sockopt::linger, 0);
    push_.connect(reply_endpoint);
    thread_ = std::thread([this] { Loop(); });
  }
  ~Lane() { Stop(); }

  void Submit(Task t) {
    {
      std::lock_guard<std::mutex> l(mu_);
      queue_.push_back(std::move(t));
    }
    cv_.notify_one();
  }
  void Stop() {
    {
      std::lock_guard<std::mutex> l(mu_);
      if (stop_) return;
      stop_ = true;
    }
    cv_.notify_one();
    if (thread_.joinable()) thread_.join();
    push_.close();
  }

  LaneStore& store() { return *store_; }
  // Scratch buffers for request parts, reused across requests (lane thread only).
  std::vector<uint64_t> scratch_keys;
  std::vector<const float*> scratch_grads;
  std::vector<float*> scratch_outs;
  /// The request-log mark this lane's rows are durable up to.
  uint64_t committed_seq() const { return committed_seq_.load(std::memory_order_acquire); }
  uint32_t index() const { return index_; }
  uint64_t NextStep() { return ++step_; }

  /// Runs `t` on the calling thread (the I/O thread) when the lane is idle with nothing
  /// queued, and replies over `reply`; false (nothing done) otherwise. Saves the two thread
  /// hops of small requests. Order holds: nothing of this lane is queued or running.
  bool TryRunInline(Task& t, zmq::socket_t& reply) {
    {
      std::lock_guard<std::mutex> l(mu_);
      if (!queue_.empty() || stop_ || !run_mu_.try_lock()) return false;
    }
    std::vector<Task> one;
    one.push_back(std::move(t));
    RunBatch(one, reply);
    run_mu_.unlock();
    return true;
  }

 private:
  void Loop() {
    std::vector<Task> batch;
    for (;;) {
      {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty() && stop_) return;
      }
      // Take the batch while holding run_mu_, so an inline run never overtakes queued tasks.
      std::lock_guard<std::mutex> run(run_mu_);
      {
        std::lock_guard<std::mutex> l(mu_);
        batch.assign(std::make_move_iterator(queue_.begin()),
                     std::make_move_iterator(queue_.end()));
        queue_.clear();
      }
      RunBatch(batch, push_);
    }
  }

  void RunBatch(std::vector<Task>& batch, zmq::socket_t& reply) {
    {
      bool wrote = false;
      for (Task& t : batch) {
        Status s = t.run(*this);
        if (!s.ok()) t.pending->Fail(s);
        wrote |= t.writes;
        if (t.seq != 0) store_->SetAppliedSeq(t.seq);
      }
      // Writes the request log does not hold (restored rows, maintenance) commit at once.
      bool unlogged = false;
      for (const Task& t : batch) unlogged |= t.writes && t.seq == 0;
      const auto now = std::chrono::steady_clock::now();
      if (wrote &&
          (unlogged || commit_interval_.count() == 0 || now - last_commit_ >= commit_interval_)) {
        // Group commit: one durability point for every write of the batch. With the request
        // log on, pushes were durable before they reached the lane; this bounds replay work.
        last_commit_ = now;
        Status s = store_->Commit();
        if (!s.ok()) {
          LOG(ERROR) << "lane " << index_ << ": commit failed: " << s.ToString();
          for (Task& t : batch) {
            if (t.writes) t.pending->Fail(s.WithContext("commit"));
          }
        } else {
          committed_seq_.store(store_->committed_seq(), std::memory_order_release);
        }
      }
      for (Task& t : batch) {
        if (t.pending->remaining.fetch_sub(1, std::memory_order_acq_rel) == 1 &&
            !t.pending->silent) {
          SendReply(reply, *t.pending);
        }
      }
      batch.clear();
    }
  }

  const uint32_t index_;
  std::unique_ptr<LaneStore> store_;
  zmq::socket_t push_;  // used only by this lane's thread
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_;  // guarded by mu_
  bool stop_ = false;       // guarded by mu_
  // Held while tasks run: by the lane thread, or by the I/O thread for an inline run.
  std::mutex run_mu_;
  uint64_t step_ = 0;  // whoever holds run_mu_
  const std::chrono::milliseconds commit_interval_;
  std::chrono::steady_clock::time_point last_commit_{};  // whoever holds run_mu_
  std::atomic<uint64_t> committed_seq_{0};
};

struct TableInfo {
  uint64_t id;
  TableSpec spec;
};

}  // namespace

class ServerImpl {
 public:
  explicit ServerImpl(const ServerOptions& o)
      : options_(o),
        router_(ctx_, zmq::socket_type::router),
        replies_(ctx_, zmq::socket_type::pull),
        slot_map_(SlotMap::Uniform(o.num_servers)) {}

  ~ServerImpl() { Shutdown(); }

  Status Start() {
    if (options_.lanes == 0 || options_.lanes > 256) {
      return Status::InvalidArgument("lanes must be in 1..256");
    }
    if (options_.num_servers == 0 || options_.rank >= options_.num_servers) {
      return Status::InvalidArgument("rank " + std::to_string(options_.rank) +
                                     " is not below the number of servers " +
                                     std::to_string(options_.num_servers));
    }
    TESSERA_ASSIGN_OR_RETURN(engine_, OpenStorageEngine(options_.storage));
    router_.set(zmq::sockopt::linger, 0);
    router_.set(zmq::sockopt::sndhwm, 0);
    router_.set(zmq::sockopt::rcvhwm, 0);
    router_.set(zmq::sockopt::router_mandatory, 0);
    if (!options_.curve_secret_key.empty()) {
      if (options_.curve_secret_key.size() != 40) {
        return Status::InvalidArgument("a CurveZMQ secret key has 40 Z85 characters, got " +
                                       std::to_string(options_.curve_secret_key.size()));
      }
      try {
        router_.set(zmq::sockopt::curve_server, 1);
        router_.set(zmq::sockopt::curve_secretkey, options_.curve_secret_key);
      } catch (const zmq::error_t& e) {
        return Status::InvalidArgument(std::string("CurveZMQ: ") + e.what());
      }
    }
    // A frame larger than the request limit plus slack is dropped by ZeroMQ with the
    // connection; requests that fit are checked against the limit with an error reply.
    router_.set(zmq::sockopt::maxmsgsize,
                static_cast<int64_t>(options_.max_request_bytes + (1 << 20)));
    try {
      router_.bind(options_.listen);
    } catch (const zmq::error_t& e) {
      return Status::Unavailable("cannot listen on '" + options_.listen + "': " + e.what());
    }
    endpoint_ = router_.get(zmq::sockopt::last_endpoint);
    const std::string reply_ep =
        "inproc://tessera-replies-" + std::to_string(reinterpret_cast<uintptr_t>(this));
    replies_.set(zmq::sockopt::rcvhwm, 0);
    replies_.bind(reply_ep);
    std::vector<std::unique_ptr<LaneStore>> stores;
    for (uint32_t i = 0; i < options_.lanes; ++i) {
      TESSERA_ASSIGN_OR_RETURN(auto store, engine_->OpenLane(i, options_.lanes));
      stores.push_back(std::move(store));
    }
    // Recovery runs on this thread before any lane thread exists.
    TESSERA_RETURN_IF_ERROR(RecoverTables(stores));
    TESSERA_RETURN_IF_ERROR(ReplayLog(stores));
    for (uint32_t i = 0; i < options_.lanes; ++i) {
      lanes_.push_back(
          std::make_unique<Lane>(i, std::move(stores[i]), ctx_, reply_ep,
                                 engine_->durable() ? options_.row_commit_interval_ms : 0));
    }
    writer_ = std::make_unique<FileWriter>(ctx_, reply_ep);
    io_ = std::thread([this] { IoLoop(); });
    LOG(INFO) << "tessera-server rank " << options_.rank << "/" << options_.num_servers
              << " listening on " << endpoint_ << " with " << options_.lanes << " lanes, "
              << (options_.storage.data_dir.empty() ? std::string("memory-only storage")
                                                    : "data in " + options_.storage.data_dir)
              << ", " << tables_.size() << " tables recovered";
    return Status::OK();
  }

  void Shutdown() {
    if (stopped_.exchange(true)) return;
    stop_.store(true);
    if (io_.joinable()) io_.join();
    for (auto& l : lanes_) l->Stop();
    if (writer_) writer_->Stop();
    lanes_.clear();
    writer_.reset();
    router_.close();
    replies_.close();
    engine_.reset();
  }

  const std::string& endpoint() const { return endpoint_; }

 private:
  // ---------------------------------------------------------------- start-up
  Status RecoverTables(std::vector<std::unique_ptr<LaneStore>>& stores) {
    std::vector<std::string> records;
    TESSERA_RETURN_IF_ERROR(engine_->ScanMeta(
        "table/", [&](std::string_view, std::string_view v) { records.emplace_back(v); }));
    for (const auto& r : records) {
      TESSERA_ASSIGN_OR_RETURN(TableSpec spec, DecodeTableSpec(r));
      const uint64_t id = TableIdForName(spec.name);
      for (auto& store : stores) TESSERA_RETURN_IF_ERROR(store->AddTable(id, spec));
      tables_[id] = TableInfo{id, spec};
      names_[spec.name] = id;
    }
    return Status::OK();
  }

  // ---------------------------------------------------------------- request log
  // Entry layout (little-endian): u8 kind (1 sparse, 2 dense), 3 bytes zero, u32 dim,
  // u64 table id, u64 count, u64 offset, then keys (sparse, count x u64) and gradients
  // (count x dim floats; dense: count floats).
  static constexpr size_t kLogHeaderBytes = 32;

  static std::string EncodeLogEntry(const Pending& p) {
    const Header& h = p.header;
    const bool sparse = h.op != Op::kDensePush;
    const uint64_t floats = sparse ? h.count * h.dim : h.count;
    std::string e(kLogHeaderBytes + (sparse ? h.count * 8 : 0) + floats * 4, '\0');
    char* d = e.data();
    d[0] = sparse ? 1 : 2;
    const uint32_t dim = h.dim;
    std::memcpy(d + 4, &dim, 4);
    std::memcpy(d + 8, &h.table_id, 8);
    std::memcpy(d + 16, &h.count, 8);
    std::memcpy(d + 24, &h.offset, 8);
    d += kLogHeaderBytes;
    if (sparse) {
      std::memcpy(d, p.keys, h.count * 8);
      d += h.count * 8;
    }
    std::memcpy(d, p.values, floats * 4);
    return e;
  }

  // Applies, per lane, the logged pushes the lane had not committed when the server stopped.
  // Marks were written under the lane layout of that run ("server/lanes"); rows go to the
  // stores of the current layout.
  Status ReplayLog(std::vector<std::unique_ptr<LaneStore>>& stores) {
    if (!engine_->durable()) return Status::OK();
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
      } else {
        TESSERA_ASSIGN_OR_RETURN(
            auto m, engine_->GetMeta("storage/lane/" + std::to_string(old_lanes) + "/" +
                                     std::to_string(l)));
        uint64_t seq = 0;
        if (m && m->size() == 8) {
          for (char c : *m) seq = (seq << 8) | static_cast<uint8_t>(c);
        }
        marks[l] = seq;
      }
    }
    uint64_t last = *std::min_element(marks.begin(), marks.end());
    for (auto& s : stores) last = std::max(last, s->committed_seq());
    for (uint64_t m : marks) last = std::max(last, m);
    const uint64_t from = *std::min_element(marks.begin(), marks.end());
    uint64_t replayed = 0;
    const ApplyContext ctx{0, NowSeconds()};
    TESSERA_RETURN_IF_ERROR(engine_->ScanLog(from, [&](uint64_t seq, std::string_view e) -> Status {
      last = std::max(last, seq);
      if (e.size() < kLogHeaderBytes || (e[0] != 1 && e[0] != 2)) {
        return Status::Corruption("malformed request-log entry " + std::to_string(seq));
      }
      uint32_t dim;
      uint64_t table, count, offset;
      std::memcpy(&dim, e.data() + 4, 4);
      std::memcpy(&table, e.data() + 8, 8);
      std::memcpy(&count, e.data() + 16, 8);
      std::memcpy(&offset, e.data() + 24, 8);
      const bool sparse = e[0] == 1;
      const uint64_t want = kLogHeaderBytes + (sparse ? count * 8 + count * dim * 4 : count * 4);
      if (e.size() != want) {
        return Status::Corruption("request-log entry " + std::to_string(seq) + " has " +
                                  std::to_string(e.size()) + " bytes, expected " +
                                  std::to_string(want));
      }
      auto t = tables_.find(table);
      if (t == tables_.end()) return Status::OK();  // a table that no longer exists
      // Copies keep the floats aligned.
      std::vector<uint64_t> keys(sparse ? count : 0);
      std::vector<float> grads(sparse ? count * dim : count);
      const char* d = e.data() + kLogHeaderBytes;
      if (sparse) {
        std::memcpy(keys.data(), d, count * 8);
        d += count * 8;
      }
      std::memcpy(grads.data(), d, grads.size() * 4);
      if (sparse) {
        std::vector<std::vector<uint64_t>> k(nl);
        std::vector<std::vector<const float*>> g(nl);
        for (uint64_t i = 0; i < count; ++i) {
          const uint32_t slot = SlotOfKey(keys[i]);
          if (seq <= marks[LaneOfSlot(slot, old_lanes)]) continue;
          const uint32_t l = LaneOfSlot(slot, nl);
          k[l].push_back(keys[i]);
          g[l].push_back(grads.data() + i * dim);
        }
        for (uint32_t l = 0; l < nl; ++l) {
          if (!k[l].empty()) TESSERA_RETURN_IF_ERROR(stores[l]->Apply(table, k[l], g[l], ctx));
        }
      } else {
        const uint64_t end = offset + count;
        for (uint64_t c = offset / kDenseChunkFloats; c * kDenseChunkFloats < end; ++c) {
          if (seq <= marks[LaneOfChunk(table, c, old_lanes)]) continue;
          const uint64_t cb = c * kDenseChunkFloats;
          const uint64_t b = std::max(offset, cb), en = std::min(end, cb + kDenseChunkFloats);
          TESSERA_RETURN_IF_ERROR(stores[LaneOfChunk(table, c, nl)]->DenseApply(
              table, c, static_cast<uint32_t>(b - cb), static_cast<uint32_t>(en - cb),
              grads.data() + (b - offset), ctx));
        }
      }
      ++replayed;
      return Status::OK();
    }));
    for (auto& s : stores) {
      s->SetAppliedSeq(last);
      TESSERA_RETURN_IF_ERROR(s->Commit());
    }
    TESSERA_RETURN_IF_ERROR(engine_->PutMeta("server/lanes", std::to_string(nl)));
    TESSERA_RETURN_IF_ERROR(engine_->TruncateLog(last));
    log_seq_ = last;
    if (replayed > 0) {
      LOG(INFO) << "replayed " << replayed << " request-log entries (up to " << last << ")";
    }
    return Status::OK();
  }

  // Logs a validated push before any lane applies it; returns its sequence number (0 when the
  // engine keeps nothing).
  Result<uint64_t> LogPush(const Pending& p) {
    if (!engine_->durable()) return uint64_t{0};
    const uint64_t seq = ++log_seq_;
    Status s = engine_->AppendLog(seq, EncodeLogEntry(p));
    if (!s.ok()) {
      --log_seq_;
      return s.WithContext("logging the push");
    }
    return seq;
  }

  // ---------------------------------------------------------------- I/O thread
  void IoLoop() {
    zmq::pollitem_t items[] = {{router_.handle(), 0, ZMQ_POLLIN, 0},
                               {replies_.handle(), 0, ZMQ_POLLIN, 0}};
    auto next_maintenance = std::chrono::steady_clock::now();
    while (!stop_.load(std::memory_order_relaxed)) {
      const auto now = std::chrono::steady_clock::now();
      if (now >= next_maintenance) {
        next_maintenance = now + std::chrono::milliseconds(options_.maintenance_interval_ms);
        Maintain();
      }
      try {
        zmq::poll(items, 2, std::chrono::milliseconds(100));
      } catch (const zmq::error_t& e) {
        if (e.num() == EINTR) continue;
        LOG(ERROR) << "poll failed: " << e.what();
        continue;
      }
      if (items[1].revents & ZMQ_POLLIN) ForwardReplies();
      if (items[0].revents & ZMQ_POLLIN) {
        // Bound the burst so replies keep flowing under load.
        for (int i = 0; i < 256; ++i) {
          std::vector<zmq::message_t> parts;
          auto n =
              zmq::recv_multipart(router_, std::back_inserter(parts), zmq::recv_flags::dontwait);
          if (!n) break;
          HandleMessage(std::move(parts));
        }
      }
    }
  }

  // Eviction and housekeeping on every lane, between request batches.
  void Maintain() {
    // The log is needed only past the mark every lane has committed.
    if (engine_->durable()) {
      uint64_t upto = log_seq_;
      for (auto& l : lanes_) upto = std::min(upto, l->committed_seq());
      if (upto > truncated_seq_) {
        Status s = engine_->TruncateLog(upto);
        if (s.ok()) {
          truncated_seq_ = upto;
        } else {
          LOG(WARNING) << "truncating the request log: " << s.ToString();
        }
      }
    }
    auto p = std::make_shared<Pending>();
    p->silent = true;
    p->remaining.store(static_cast<uint32_t>(lanes_.size()));
    // Every push logged so far is queued ahead of this task on each lane (lanes run in order).
    const uint64_t seq = log_seq_;
    for (auto& lane : lanes_) {
      lane->Submit(
          Task{p,
               [](Lane& lane) {
                 Status s = lane.store().Maintain(ApplyContext{lane.NextStep(), NowSeconds()});
                 if (!s.ok()) {
                   LOG(WARNING) << "lane " << lane.index() << " maintenance: " << s.ToString();
                 }
                 return Status::OK();
               },
               true, seq});
    }
  }

  void ForwardReplies() {
    for (;;) {
      std::vector<zmq::message_t> parts;
      auto n = zmq::recv_multipart(replies_, std::back_inserter(parts), zmq::recv_flags::dontwait);
      if (!n) return;
      SendToPeer(parts);
    }
  }

  void SendToPeer(std::vector<zmq::message_t>& parts) {
    try {
      zmq::send_multipart(router_, parts, zmq::send_flags::dontwait);
    } catch (const zmq::error_t& e) {
      // The peer is gone (or its queue is full): nothing else to tell it.
      VLOG(1) << "dropping reply: " << e.what();
    }
  }

  void ReplyError(zmq::message_t identity, const Header& req, const Status& s) {
    ++errors_;
    Header h;
    h.request_id = req.request_id;
    // Echo the op only when it is one this build knows (the reply must decode on the peer).
    h.op = static_cast<uint8_t>(req.op) <= kMaxOp ? req.op : Op::kInvalid;
    h.table_id = req.table_id;
    h.status = s.code() == StatusCode::kOk ? StatusCode::kInternal : s.code();
    h.message = s.message();
    std::string env;
    EncodeHeader(h, &env);
    std::vector<zmq::message_t> parts;
    parts.push_back(std::move(identity));
    parts.emplace_back(env.data(), env.size());
    SendToPeer(parts);
  }

  void ReplyOk(zmq::message_t identity, const Header& req, Header h = Header(),
               const std::string* data = nullptr) {
    h.request_id = req.request_id;
    h.op = req.op;
    h.table_id = req.table_id;
    h.status = StatusCode::kOk;
    std::string env;
    EncodeHeader(h, &env);
    std::vector<zmq::message_t> parts;
    parts.push_back(std::move(identity));
    parts.emplace_back(env.data(), env.size());
    if (data != nullptr) parts.emplace_back(data->data(), data->size());
    SendToPeer(parts);
  }

  void HandleMessage(std::vector<zmq::message_t> parts) {
    ++requests_;
    if (parts.size() < 2) return;  // ROUTER always adds the identity; nothing to answer.
    auto p = std::make_shared<Pending>();
    p->identity = std::move(parts[0]);
    Status s = DecodeHeader(parts[1].data(), parts[1].size(), &p->header);
    if (!s.ok()) {
      ReplyError(std::move(p->identity), p->header, s);
      return;
    }
    for (size_t i = 2; i < parts.size(); ++i) p->frames.push_back(std::move(parts[i]));
    s = Dispatch(p);
    if (!s.ok()) ReplyError(std::move(p->identity), p->header, s);
  }

  Result<const TableInfo*> FindTable(const Header& h, TableKind kind) {
    auto it = tables_.find(h.table_id);
    if (it == tables_.end()) {
      return Status::NotFound("unknown table id " + std::to_string(h.table_id) + " on server " +
                              std::to_string(options_.rank));
    }
    if (it->second.spec.kind != kind) {
      return Status::InvalidArgument(
          "table '" + it->second.spec.name + "' is " +
          (it->second.spec.kind == TableKind::kSparse ? "sparse" : "dense") + ", op " +
          std::string(OpName(h.op)) + " needs a " +
          (kind == TableKind::kSparse ? "sparse" : "dense") + " table");
    }
    return &it->second;
  }

  Status ExpectFrames(const Pending& p, size_t n) {
    if (p.frames.size() != n) {
      return Status::InvalidArgument(std::string(OpName(p.header.op)) + " expects " +
                                     std::to_string(n) + " data frame(s), got " +
                                     std::to_string(p.frames.size()));
    }
    return Status::OK();
  }

  Status CheckFrameSize(const zmq::message_t& f, uint64_t expected, const char* what) {
    if (f.size() != expected) {
      return Status::InvalidArgument(std::string(what) + " frame has " + std::to_string(f.size()) +
                                     " bytes, envelope implies " + std::to_string(expected));
    }
    return Status::OK();
  }

  // Bytes a request of `elements` floats (plus keys) would need; ResourceExhausted past limit.
  Status CheckBudget(uint64_t count, uint64_t floats_per_item, bool with_keys) {
    const uint64_t per = floats_per_item * 4 + (with_keys ? 8 : 0);
    if (per != 0 && count > options_.max_request_bytes / per) {
      return Status::ResourceExhausted("request of " + std::to_string(count) + " items x " +
                                       std::to_string(per) +
                                       " bytes exceeds the server's per-request limit of " +
                                       std::to_string(options_.max_request_bytes) + " bytes");
    }
    return Status::OK();
  }

  template <typename T>
  static const T* View(zmq::message_t& f, std::vector<T>* copy) {
    if (reinterpret_cast<uintptr_t>(f.data()) % alignof(T) == 0) {
      return static_cast<const T*>(f.data());
    }
    copy->resize(f.size() / sizeof(T));
    std::memcpy(copy->data(), f.data(), f.size());
    return copy->data();
  }

  Status Dispatch(const std::shared_ptr<Pending>& p) {
    const Header& h = p->header;
    switch (h.op) {
      case Op::kPing: {
        Header r;
        r.num_workers = options_.num_servers;
        r.worker_id = options_.rank;
        ReplyOk(std::move(p->identity), h, r);
        return Status::OK();
      }
      case Op::kCreateTable:
        return CreateTable(p);
      case Op::kGetTable:
        return GetTable(p);
      case Op::kSparsePull:
      case Op::kSparsePush:
      case Op::kSparsePushPull:
        return Sparse(p);
      case Op::kDensePull:
      case Op::kDensePush:
        return Dense(p);
      case Op::kClock:
        return ClockOp(p);
      case Op::kBarrier:
        return BarrierOp(p);
      case Op::kPutMeta:
      case Op::kGetMeta:
        return MetaOp(p);
      case Op::kStats:
        return StatsOp(p);
      case Op::kCheckpoint:
        return CheckpointOp(p);
      case Op::kRestore:
        return RestoreOp(p);
      case Op::kExport:
        return ExportOp(p);
      case Op::kInvalid:
        break;
    }
    return Status::InvalidArgument("unsupported op " + std::to_string(static_cast<int>(h.op)));
  }

  // Requests of at most this many floats that touch one lane may run on the I/O thread.
  static constexpr uint64_t kInlineMaxFloats = 16384;

  // Queues a task on lane `l`, or runs it inline when allowed and the lane is idle.
  void Dispatch(uint32_t l, Task task, bool may_inline) {
    if (may_inline && lanes_[l]->TryRunInline(task, router_)) return;
    lanes_[l]->Submit(std::move(task));
  }

  // Runs `fn` on every lane; the reply goes out when all are done.
  void RunOnAllLanes(const std::shared_ptr<Pending>& p, std::function<Status(Lane&)> fn,
                     bool writes) {
    p->remaining.store(static_cast<uint32_t>(lanes_.size()));
    for (auto& lane : lanes_) lane->Submit(Task{p, fn, writes});
  }

  Status CreateTable(const std::shared_ptr<Pending>& p) {
    if (!p->header.spec) return Status::InvalidArgument("CreateTable without a spec");
    const TableSpec& spec = *p->header.spec;
    TESSERA_RETURN_IF_ERROR(ValidateTableSpec(spec));
    const uint64_t id = TableIdForName(spec.name);
    auto it = tables_.find(id);
    if (it != tables_.end()) {
      std::string diff = DescribeSpecDifference(it->second.spec, spec);
      if (!diff.empty()) {
        return Status::AlreadyExists("table '" + spec.name +
                                     "' exists with another spec (existing vs requested): " + diff);
      }
      Header r;
      r.table_id = id;
      r.spec = spec;
      ReplyOk(std::move(p->identity), p->header, r);
      return Status::OK();
    }
    TESSERA_RETURN_IF_ERROR(engine_->PutMeta("table/" + std::to_string(id), EncodeTableSpec(spec)));
    tables_[id] = TableInfo{id, spec};
    names_[spec.name] = id;
    p->header.table_id = id;
    RunOnAllLanes(
        p, [id, spec](Lane& lane) { return lane.store().AddTable(id, spec); }, false);
    return Status::OK();
  }

  Status GetTable(const std::shared_ptr<Pending>& p) {
    auto it = names_.find(p->header.name);
    if (it == names_.end()) return Status::NotFound("no table named '" + p->header.name + "'");
    Header r;
    r.table_id = it->second;
    r.spec = tables_.at(it->second).spec;
    Header req = p->header;
    req.table_id = it->second;
    ReplyOk(std::move(p->identity), req, r);
    return Status::OK();
  }

  // ---------------------------------------------------------------- sparse
  Status Sparse(const std::shared_ptr<Pending>& p) {
    const Header& h = p->header;
    TESSERA_ASSIGN_OR_RETURN(const TableInfo* t, FindTable(h, TableKind::kSparse));
    const uint32_t dim = t->spec.dim;
    if (h.dim != dim) {
      return Status::InvalidArgument("table '" + t->spec.name + "' has dim " + std::to_string(dim) +
                                     ", request says " + std::to_string(h.dim));
    }
    const bool push = h.op != Op::kSparsePull;
    const bool pull = h.op != Op::kSparsePush;
    TESSERA_RETURN_IF_ERROR(CheckBudget(h.count, dim * ((push ? 1 : 0) + (pull ? 1 : 0)), true));
    TESSERA_RETURN_IF_ERROR(ExpectFrames(*p, push ? 2 : 1));
    if (h.elem_type != ElemType::kF32) {
      return Status::InvalidArgument("sparse values must be F32, got element type " +
                                     std::to_string(static_cast<int>(h.elem_type)));
    }
    TESSERA_RETURN_IF_ERROR(CheckFrameSize(p->frames[0], h.count * 8, "keys"));
    if (push) TESSERA_RETURN_IF_ERROR(CheckFrameSize(p->frames[1], h.count * dim * 4, "values"));
    p->keys = View<uint64_t>(p->frames[0], &p->key_copy);
    if (push) p->values = View<float>(p->frames[1], &p->value_copy);

    // Split by lane; refuse keys this server does not own (a stale slot map).
    const uint32_t nl = static_cast<uint32_t>(lanes_.size());
    std::vector<std::vector<uint32_t>> by_lane(nl);
    for (auto& v : by_lane) v.reserve(h.count / nl + 16);
    for (uint64_t i = 0; i < h.count; ++i) {
      const uint32_t slot = SlotOfKey(p->keys[i]);
      if (slot_map_.ServerOfSlot(slot) != options_.rank) {
        return Status::FailedPrecondition("key " + std::to_string(p->keys[i]) + " (slot " +
                                          std::to_string(slot) + ") belongs to server " +
                                          std::to_string(slot_map_.ServerOfSlot(slot)) +
                                          ", not server " + std::to_string(options_.rank));
      }
      by_lane[LaneOfSlot(slot, nl)].push_back(static_cast<uint32_t>(i));
    }
    if (push) {
      const uint64_t bad = FirstNonFinite(p->values, h.count * dim);
      if (bad != kAllFinite) {
        return Status::InvalidArgument("gradient of key " + std::to_string(p->keys[bad / dim]) +
                                       " is not finite");
      }
    }
    if (ParkedByCut(p)) return Status::OK();
    if (!WaitForClock(p)) return Status::OK();  // parked
    return SubmitSparse(p, std::move(by_lane));
  }

  static constexpr uint64_t kAllFinite = ~uint64_t{0};
  // Index of the first NaN or infinity in v[0..n), or kAllFinite. Checks the exponent bits
  // in blocks so that the compiler vectorizes the scan.
  static uint64_t FirstNonFinite(const float* v, uint64_t n) {
    const uint32_t* bits = reinterpret_cast<const uint32_t*>(v);
    constexpr uint64_t kBlock = 1024;
    for (uint64_t b = 0; b < n; b += kBlock) {
      const uint64_t e = std::min(n, b + kBlock);
      uint32_t any = 0;
      for (uint64_t i = b; i < e; ++i) any |= ((bits[i] & 0x7f800000u) == 0x7f800000u);
      if (any) {
        for (uint64_t i = b; i < e; ++i) {
          if ((bits[i] & 0x7f800000u) == 0x7f800000u) return i;
        }
      }
    }
    return kAllFinite;
  }

  Status SubmitSparse(const std::shared_ptr<Pending>& p,
                      std::vector<std::vector<uint32_t>> by_lane) {
    const Header& h = p->header;
    const bool push = h.op != Op::kSparsePull;
    const bool pull = h.op != Op::kSparsePush;
    const uint32_t dim = h.dim;
    if (pull) {
      p->out = zmq::message_t(h.count * dim * sizeof(float));
      p->has_out = true;
    }
    if (push) {
      ++pushes_;
      push_keys_ += h.count;
      if (h.num_workers > 0) max_push_clock_ = std::max(max_push_clock_, h.clock);
    }
    if (pull) {
      ++pulls_;
      pull_keys_ += h.count;
    }
    uint64_t seq = 0;
    if (push) {
      TESSERA_ASSIGN_OR_RETURN(seq, LogPush(*p));
    }
    uint32_t tasks = 0;
    for (auto& v : by_lane) tasks += v.empty() ? 0 : 1;
    if (tasks == 0) {
      p->remaining.store(1);
      lanes_[0]->Submit(Task{p, [](Lane&) { return Status::OK(); }, false});
      return Status::OK();
    }
    p->remaining.store(tasks);
    const uint64_t table_id = h.table_id;
    for (uint32_t l = 0; l < by_lane.size(); ++l) {
      if (by_lane[l].empty()) continue;
      auto idx = std::make_shared<std::vector<uint32_t>>(std::move(by_lane[l]));
      Pending* raw = p.get();
      Task task{p,
                [raw, idx, table_id, dim, push, pull](Lane& lane) -> Status {
                  const size_t n = idx->size();
                  std::vector<uint64_t>& keys = lane.scratch_keys;
                  std::vector<const float*>& grads = lane.scratch_grads;
                  std::vector<float*>& outs = lane.scratch_outs;
                  keys.resize(n);
                  for (size_t i = 0; i < n; ++i) keys[i] = raw->keys[(*idx)[i]];
                  if (push) {
                    grads.resize(n);
                    for (size_t i = 0; i < n; ++i) grads[i] = raw->values + size_t{(*idx)[i]} * dim;
                    ApplyContext ctx{lane.NextStep(), NowSeconds()};
                    TESSERA_RETURN_IF_ERROR(lane.store().Apply(table_id, keys, grads, ctx));
                  }
                  if (pull) {
                    outs.resize(n);
                    float* base = static_cast<float*>(raw->out.data());
                    for (size_t i = 0; i < n; ++i) outs[i] = base + size_t{(*idx)[i]} * dim;
                    TESSERA_RETURN_IF_ERROR(lane.store().Lookup(table_id, keys, outs));
                  }
                  return Status::OK();
                },
                push, seq};
      Dispatch(l, std::move(task), tasks == 1 && h.count * dim <= kInlineMaxFloats);
    }
    return Status::OK();
  }

  // ---------------------------------------------------------------- dense
  Status Dense(const std::shared_ptr<Pending>& p) {
    const Header& h = p->header;
    TESSERA_ASSIGN_OR_RETURN(const TableInfo* t, FindTable(h, TableKind::kDense));
    const bool push = h.op == Op::kDensePush;
    TESSERA_RETURN_IF_ERROR(CheckBudget(h.count, 1, false));
    if (h.count == 0) return Status::InvalidArgument("dense range of zero elements");
    if (h.offset > t->spec.length || h.count > t->spec.length - h.offset) {
      return Status::InvalidArgument(
          "dense range [" + std::to_string(h.offset) + ", " + std::to_string(h.offset + h.count) +
          ") outside table '" + t->spec.name + "' of length " + std::to_string(t->spec.length));
    }
    const DenseRange mine =
        DenseRangeOfServer(h.table_id, t->spec.length, options_.rank, options_.num_servers);
    if (h.offset < mine.begin || h.offset + h.count > mine.end) {
      return Status::FailedPrecondition(
          "dense range [" + std::to_string(h.offset) + ", " + std::to_string(h.offset + h.count) +
          ") of table '" + t->spec.name + "' is not within server " +
          std::to_string(options_.rank) + "'s part [" + std::to_string(mine.begin) + ", " +
          std::to_string(mine.end) + ")");
    }
    TESSERA_RETURN_IF_ERROR(ExpectFrames(*p, push ? 1 : 0));
    if (push) {
      if (h.elem_type != ElemType::kF32) {
        return Status::InvalidArgument("dense values must be F32");
      }
      TESSERA_RETURN_IF_ERROR(CheckFrameSize(p->frames[0], h.count * 4, "values"));
      p->values = View<float>(p->frames[0], &p->value_copy);
      const uint64_t bad = FirstNonFinite(p->values, h.count);
      if (bad != kAllFinite) {
        return Status::InvalidArgument("dense gradient element " + std::to_string(h.offset + bad) +
                                       " is not finite");
      }
    }
    if (ParkedByCut(p)) return Status::OK();
    if (!WaitForClock(p)) return Status::OK();
    return SubmitDense(p);
  }

  Status SubmitDense(const std::shared_ptr<Pending>& p) {
    const Header& h = p->header;
    const bool push = h.op == Op::kDensePush;
    if (!push) {
      p->out = zmq::message_t(h.count * sizeof(float));
      p->has_out = true;
      ++pulls_;
    } else {
      ++pushes_;
      if (h.num_workers > 0) max_push_clock_ = std::max(max_push_clock_, h.clock);
    }
    struct Seg {
      uint64_t chunk;
      uint32_t begin, end;  // within the chunk
      uint64_t pos;         // element index within the request
    };
    const uint32_t nl = static_cast<uint32_t>(lanes_.size());
    std::vector<std::vector<Seg>> by_lane(nl);
    const uint64_t first = h.offset, last = h.offset + h.count;
    for (uint64_t c = first / kDenseChunkFloats; c * kDenseChunkFloats < last; ++c) {
      const uint64_t cb = c * kDenseChunkFloats;
      const uint64_t b = std::max(first, cb), e = std::min(last, cb + kDenseChunkFloats);
      by_lane[LaneOfChunk(h.table_id, c, nl)].push_back(
          Seg{c, static_cast<uint32_t>(b - cb), static_cast<uint32_t>(e - cb), b - first});
    }
    uint64_t seq = 0;
    if (push) {
      TESSERA_ASSIGN_OR_RETURN(seq, LogPush(*p));
    }
    uint32_t tasks = 0;
    for (auto& v : by_lane) tasks += v.empty() ? 0 : 1;
    p->remaining.store(tasks);
    const uint64_t table_id = h.table_id;
    Pending* raw = p.get();
    for (uint32_t l = 0; l < nl; ++l) {
      if (by_lane[l].empty()) continue;
      auto segs = std::make_shared<std::vector<Seg>>(std::move(by_lane[l]));
      Task task{p,
                [raw, segs, table_id, push](Lane& lane) -> Status {
                  ApplyContext ctx{lane.NextStep(), NowSeconds()};
                  for (const Seg& s : *segs) {
                    if (push) {
                      TESSERA_RETURN_IF_ERROR(lane.store().DenseApply(
                          table_id, s.chunk, s.begin, s.end, raw->values + s.pos, ctx));
                    } else {
                      float* out = static_cast<float*>(raw->out.data()) + s.pos;
                      TESSERA_RETURN_IF_ERROR(
                          lane.store().DenseRead(table_id, s.chunk, s.begin, s.end, out));
                    }
                  }
                  return Status::OK();
                },
                push, seq};
      Dispatch(l, std::move(task), tasks == 1 && h.count <= kInlineMaxFloats);
    }
    return Status::OK();
  }

  // ---------------------------------------------------------------- consistency
  int64_t MinClock(uint32_t num_workers) const {
    int64_t m = INT64_MAX;
    for (uint32_t w = 0; w < num_workers; ++w) {
      auto it = clocks_.find(w);
      m = std::min(m, it == clocks_.end() ? int64_t{0} : it->second);
    }
    return m;
  }

  static bool IsRead(Op op) {
    return op == Op::kSparsePull || op == Op::kSparsePushPull || op == Op::kDensePull;
  }

  // True when the request may run now; otherwise parks it until the clocks catch up.
  bool WaitForClock(const std::shared_ptr<Pending>& p) {
    const Header& h = p->header;
    if (!IsRead(h.op) || h.staleness < 0 || h.num_workers == 0) return true;
    if (MinClock(h.num_workers) >= h.clock - h.staleness) return true;
    parked_.push_back(p);
    ++parked_total_;
    return false;
  }

  void ReleaseParked() {
    auto parked = std::move(parked_);
    parked_.clear();
    for (auto& p : parked) Readmit(p);
  }

  // A parked, validated request goes through both gates again: the checkpoint cut (writes of
  // later steps) and the staleness bound (reads); each may park it anew.
  void Readmit(const std::shared_ptr<Pending>& p) {
    if (ParkedByCut(p)) return;
    if (!WaitForClock(p)) return;
    Resubmit(p);
  }

  // Submits a validated request that was parked.
  void Resubmit(const std::shared_ptr<Pending>& p) {
    const Header& h = p->header;
    Status s;
    if (h.op == Op::kDensePull || h.op == Op::kDensePush) {
      s = SubmitDense(p);
    } else {
      // Re-split by lane (cheap compared to waiting).
      const uint32_t nl = static_cast<uint32_t>(lanes_.size());
      std::vector<std::vector<uint32_t>> by_lane(nl);
      for (uint64_t i = 0; i < h.count; ++i) {
        by_lane[LaneOfSlot(SlotOfKey(p->keys[i]), nl)].push_back(static_cast<uint32_t>(i));
      }
      s = SubmitSparse(p, std::move(by_lane));
    }
    if (!s.ok()) ReplyError(std::move(p->identity), h, s);
  }

  Status ClockOp(const std::shared_ptr<Pending>& p) {
    const Header& h = p->header;
    if (h.clock < 0) return Status::InvalidArgument("negative clock");
    int64_t& c = clocks_[h.worker_id];
    // A restarted worker may set its clock back to its stored value: take what it says.
    c = h.clock;
    job_workers_ = std::max(job_workers_, h.num_workers);
    ReplyOk(std::move(p->identity), h);
    ReleaseParked();
    TakeSnapshotIfReady();
    return Status::OK();
  }

  struct BarrierWait {
    zmq::message_t identity;
    Header header;
  };

  Status BarrierOp(const std::shared_ptr<Pending>& p) {
    const Header& h = p->header;
    if (h.num_workers == 0) return Status::InvalidArgument("barrier with zero workers");
    if (h.name.empty()) return Status::InvalidArgument("barrier without a name");
    auto& waiting = barriers_[h.name];
    for (auto it = waiting.begin(); it != waiting.end(); ++it) {
      if (it->header.worker_id == h.worker_id) {
        // The same worker again (it retried after reconnecting): keep the newest request.
        waiting.erase(it);
        break;
      }
    }
    waiting.push_back(BarrierWait{std::move(p->identity), h});
    if (waiting.size() >= h.num_workers) {
      auto all = std::move(waiting);
      barriers_.erase(h.name);
      for (auto& w : all) ReplyOk(std::move(w.identity), w.header);
    }
    return Status::OK();
  }

  Status MetaOp(const std::shared_ptr<Pending>& p) {
    const Header& h = p->header;
    if (h.name.empty() || h.name.size() > 1024) {
      return Status::InvalidArgument("meta name must have 1..1024 bytes");
    }
    const std::string key = "user/" + h.name;
    if (h.op == Op::kPutMeta) {
      TESSERA_RETURN_IF_ERROR(ExpectFrames(*p, 1));
      if (p->frames[0].size() > (1 << 20)) {
        return Status::ResourceExhausted("meta records are limited to 1 MiB");
      }
      TESSERA_RETURN_IF_ERROR(engine_->PutMeta(key, p->frames[0].to_string_view()));
      ReplyOk(std::move(p->identity), h);
      return Status::OK();
    }
    TESSERA_ASSIGN_OR_RETURN(std::optional<std::string> v, engine_->GetMeta(key));
    Header r;
    r.elem_type = ElemType::kBytes;
    r.count = v ? 1 : 0;
    ReplyOk(std::move(p->identity), h, r, v ? &*v : nullptr);
    return Status::OK();
  }

  Status StatsOp(const std::shared_ptr<Pending>& p) {
    std::ostringstream s;
    s << "rank " << options_.rank << "\n"
      << "num_servers " << options_.num_servers << "\n"
      << "lanes " << lanes_.size() << "\n"
      << "tables " << tables_.size() << "\n"
      << "requests " << requests_ << "\n"
      << "errors " << errors_ << "\n"
      << "pushes " << pushes_ << "\n"
      << "push_keys " << push_keys_ << "\n"
      << "pulls " << pulls_ << "\n"
      << "pull_keys " << pull_keys_ << "\n"
      << "parked_now " << parked_.size() << "\n"
      << "parked_total " << parked_total_ << "\n"
      << "job_workers " << job_workers_ << "\n"
      << "min_clock " << (job_workers_ ? MinClock(job_workers_) : 0) << "\n"
      << "max_clock " << MaxClock() << "\n"
      << "max_push_clock " << max_push_clock_ << "\n"
      << "checkpoint_pending " << (cut_ ? 1 : 0) << "\n";
    for (auto& [id, t] : tables_) {
      s << "table " << t.spec.name << " id=" << id
        << " kind=" << (t.spec.kind == TableKind::kSparse ? "sparse" : "dense")
        << (t.spec.kind == TableKind::kSparse ? " dim=" : " length=")
        << (t.spec.kind == TableKind::kSparse ? t.spec.dim : t.spec.length)
        << " optimizer=" << OptimizerKindName(t.spec.optimizer.kind)
        << " lr=" << t.spec.optimizer.learning_rate << "\n";
    }
    p->text.assign(lanes_.size() + 1, std::string());
    p->text[0] = s.str();
    Pending* raw = p.get();
    RunOnAllLanes(
        p,
        [raw](Lane& lane) {
          StoreStats st = lane.store().stats();
          std::ostringstream o;
          const std::string l = "lane" + std::to_string(lane.index()) + "_";
          o << l << "rows_in_memory " << st.rows_in_memory << "\n"
            << l << "bytes_in_memory " << st.bytes_in_memory << "\n"
            << l << "lookups " << st.lookups << "\n"
            << l << "memory_hits " << st.memory_hits << "\n"
            << l << "applies " << st.applies << "\n"
            << l << "evicted_rows " << st.evicted_rows << "\n";
          std::lock_guard<std::mutex> g(raw->mu);
          raw->text[lane.index() + 1] = o.str();
          return Status::OK();
        },
        false);
    return Status::OK();
  }

  // ---------------------------------------------------------------- checkpoints
  int64_t MaxClock() const {
    int64_t m = 0;
    for (auto& [w, c] : clocks_) m = std::max(m, c);
    return m;
  }

  static bool IsWrite(Op op) {
    return op == Op::kSparsePush || op == Op::kSparsePushPull || op == Op::kDensePush;
  }

  // While a checkpoint at cut C is pending, pushes of steps after C wait until it is taken.
  bool ParkedByCut(const std::shared_ptr<Pending>& p) {
    const Header& h = p->header;
    if (!cut_ || !IsWrite(h.op) || h.num_workers == 0 || h.clock <= cut_->cut) return false;
    cut_parked_.push_back(p);
    return true;
  }

  std::string ServerDir(const std::string& dir, uint32_t rank) const {
    return dir + "/server-" + std::to_string(rank);
  }

  Status CheckpointOp(const std::shared_ptr<Pending>& p) {
    const Header& h = p->header;
    if (h.count == 1) {  // abort
      if (cut_) {
        ReplyError(std::move(cut_->request->identity), cut_->request->header,
                   Status::Cancelled("checkpoint aborted"));
        cut_.reset();
        ReleaseCutParked();
      }
      ReplyOk(std::move(p->identity), h);
      return Status::OK();
    }
    if (h.name.empty()) return Status::InvalidArgument("checkpoint without a directory");
    if (cut_) return Status::FailedPrecondition("a checkpoint is already in progress");
    if (h.num_workers > 0 && max_push_clock_ > h.clock) {
      return Status::FailedPrecondition("cut at clock " + std::to_string(h.clock) +
                                        " already passed: a push of clock " +
                                        std::to_string(max_push_clock_) + " was applied");
    }
    std::error_code ec;
    std::filesystem::create_directories(ServerDir(h.name, options_.rank), ec);
    if (ec) {
      return Status::IOError("cannot create '" + ServerDir(h.name, options_.rank) +
                             "': " + ec.message());
    }
    cut_ = CutState{h.clock, h.num_workers, h.name, p};
    TakeSnapshotIfReady();
    return Status::OK();
  }

  // Takes the pending snapshot once every worker has finished the steps up to the cut.
  void TakeSnapshotIfReady() {
    if (!cut_) return;
    if (cut_->num_workers > 0 && MinClock(cut_->num_workers) < cut_->cut + 1) return;
    CutState cut = std::move(*cut_);
    cut_.reset();
    const std::string dir = ServerDir(cut.dir, options_.rank);
    std::vector<std::pair<uint64_t, TableSpec>> tables;
    std::vector<std::string> specs;
    for (auto& [id, t] : tables_) {
      tables.emplace_back(id, t.spec);
      specs.push_back(EncodeTableSpec(t.spec));
    }
    Status s = WriteBlobs(dir + "/tables", specs);
    if (s.ok()) {
      std::vector<std::string> meta;
      s = engine_->ScanMeta("user/", [&](std::string_view k, std::string_view v) {
        meta.emplace_back(k);
        meta.emplace_back(v);
      });
      if (s.ok()) s = WriteBlobs(dir + "/meta", meta);
    }
    if (s.ok()) {
      std::vector<std::string> info = {std::to_string(options_.rank),
                                       std::to_string(options_.num_servers),
                                       std::to_string(cut.cut), std::to_string(lanes_.size())};
      s = WriteBlobs(dir + "/manifest", info);
    }
    if (!s.ok()) {
      ReplyError(std::move(cut.request->identity), cut.request->header, s);
    } else {
      // Lanes run tasks in order: each writes its rows before it sees any released push.
      LOG(INFO) << "checkpoint at clock " << cut.cut << " into " << dir;
      // A lane pauses only to copy its rows into memory; the file writer thread writes and
      // fsyncs them. Each lane and each file completes the request once: 2 x lanes.
      auto p = cut.request;
      p->remaining.store(static_cast<uint32_t>(2 * lanes_.size()));
      FileWriter* writer = writer_.get();
      for (auto& lane : lanes_) {
        lane->Submit(Task{p,
                          [p, dir, tables, writer](Lane& lane) -> Status {
                            auto data = std::make_shared<std::string>();
                            Status s = SerializeLaneSnapshot(lane.store(), tables, {}, data.get());
                            if (!s.ok()) {
                              data.reset();
                              // The writer still completes its share, with nothing to write.
                              p->Fail(s);
                              data = std::make_shared<std::string>();
                            }
                            writer->Submit(p, dir + "/lane-" + std::to_string(lane.index()),
                                           std::move(data));
                            return Status::OK();
                          },
                          false});
      }
    }
    ReleaseCutParked();
  }

  void ReleaseCutParked() {
    auto parked = std::move(cut_parked_);
    cut_parked_.clear();
    for (auto& p : parked) Readmit(p);
  }

  // Loads a checkpoint taken by a cluster of any size: every server reads every old server's
  // files and keeps the rows its slots (and dense ranges) now own.
  Status RestoreOp(const std::shared_ptr<Pending>& p) {
    const std::string& dir = p->header.name;
    if (!std::filesystem::exists(dir + "/CHECKPOINT")) {
      return Status::NotFound("'" + dir + "' holds no complete checkpoint (no CHECKPOINT file)");
    }
    TESSERA_ASSIGN_OR_RETURN(auto info, ReadBlobs(ServerDir(dir, 0) + "/manifest"));
    if (info.size() != 4) return Status::Corruption("bad manifest in '" + dir + "'");
    TESSERA_ASSIGN_OR_RETURN(uint64_t old_servers_n,
                             ParseStoredNumber(info[1], "servers in the checkpoint", 65535));
    const uint32_t old_servers = static_cast<uint32_t>(old_servers_n);
    // Tables first (all old servers hold every spec; read server 0's).
    TESSERA_ASSIGN_OR_RETURN(auto specs, ReadBlobs(ServerDir(dir, 0) + "/tables"));
    std::vector<std::pair<uint64_t, TableSpec>> restored;
    for (const auto& b : specs) {
      TESSERA_ASSIGN_OR_RETURN(TableSpec spec, DecodeTableSpec(b));
      const uint64_t id = TableIdForName(spec.name);
      auto it = tables_.find(id);
      if (it != tables_.end()) {
        std::string diff = DescribeSpecDifference(it->second.spec, spec);
        if (!diff.empty()) {
          return Status::AlreadyExists("table '" + spec.name +
                                       "' exists with another spec than the checkpoint's: " + diff);
        }
      } else {
        TESSERA_RETURN_IF_ERROR(
            engine_->PutMeta("table/" + std::to_string(id), EncodeTableSpec(spec)));
        tables_[id] = TableInfo{id, spec};
        names_[spec.name] = id;
      }
      restored.emplace_back(id, spec);
    }
    const uint32_t nl = static_cast<uint32_t>(lanes_.size());
    // A guard count keeps the reply back until every batch is submitted.
    p->remaining.store(1);
    auto submit = [&](uint32_t lane, std::function<Status(Lane&)> fn) {
      p->remaining.fetch_add(1);
      lanes_[lane]->Submit(Task{p, std::move(fn), true});
    };
    for (uint32_t l = 0; l < nl; ++l) {
      submit(l, [restored](Lane& lane) -> Status {
        for (auto& [id, spec] : restored) TESSERA_RETURN_IF_ERROR(lane.store().AddTable(id, spec));
        return Status::OK();
      });
    }
    if (options_.rank == 0) {
      TESSERA_ASSIGN_OR_RETURN(auto meta, ReadBlobs(ServerDir(dir, 0) + "/meta"));
      for (size_t i = 0; i + 1 < meta.size(); i += 2) {
        TESSERA_RETURN_IF_ERROR(engine_->PutMeta(meta[i], meta[i + 1]));
      }
    }
    // Rows, in batches per lane.
    struct Batch {
      std::vector<uint64_t> tables, keys;
      std::vector<RowMeta> metas;
      std::vector<std::vector<float>> rows;
      std::vector<bool> dense;
    };
    std::vector<std::shared_ptr<Batch>> batches(nl);
    auto flush = [&](uint32_t l) {
      if (!batches[l] || batches[l]->keys.empty()) return;
      auto b = std::move(batches[l]);
      batches[l].reset();
      submit(l, [b](Lane& lane) -> Status {
        for (size_t i = 0; i < b->keys.size(); ++i) {
          if (b->dense[i]) {
            TESSERA_RETURN_IF_ERROR(lane.store().PutDenseChunk(b->tables[i], b->keys[i],
                                                               b->rows[i].data(), b->metas[i]));
          } else {
            const float* row = b->rows[i].data();
            TESSERA_RETURN_IF_ERROR(lane.store().PutRows(
                b->tables[i], std::span<const uint64_t>(&b->keys[i], 1),
                std::span<const float* const>(&row, 1), std::span<const RowMeta>(&b->metas[i], 1)));
          }
        }
        return Status::OK();
      });
    };
    uint64_t loaded = 0;
    for (uint32_t old = 0; old < old_servers; ++old) {
      TESSERA_ASSIGN_OR_RETURN(auto oinfo, ReadBlobs(ServerDir(dir, old) + "/manifest"));
      if (oinfo.size() != 4)
        return Status::Corruption("bad manifest of server " + std::to_string(old));
      TESSERA_ASSIGN_OR_RETURN(uint64_t old_lanes,
                               ParseStoredNumber(oinfo[3], "lanes in the checkpoint", 256));
      for (uint32_t ol = 0; ol < old_lanes; ++ol) {
        const std::string path = ServerDir(dir, old) + "/lane-" + std::to_string(ol);
        TESSERA_RETURN_IF_ERROR(ReadRecordFile(path, [&](const Record& r) -> Status {
          auto t = tables_.find(r.table_id);
          if (t == tables_.end()) return Status::Corruption("row of an unknown table in " + path);
          uint32_t lane;
          const bool dense = r.kind == Record::kDenseChunk;
          if (dense) {
            const DenseRange mine = DenseRangeOfServer(r.table_id, t->second.spec.length,
                                                       options_.rank, options_.num_servers);
            const uint64_t first = r.key * kDenseChunkFloats;
            if (first < mine.begin || first >= mine.end) return Status::OK();
            lane = LaneOfChunk(r.table_id, r.key, nl);
          } else {
            const uint32_t slot = SlotOfKey(r.key);
            if (slot_map_.ServerOfSlot(slot) != options_.rank) return Status::OK();
            lane = LaneOfSlot(slot, nl);
          }
          if (!batches[lane]) batches[lane] = std::make_shared<Batch>();
          Batch& b = *batches[lane];
          b.tables.push_back(r.table_id);
          b.keys.push_back(r.key);
          b.metas.push_back(RowMeta{r.meta.update_count, r.meta.last_step, r.meta.last_update_s});
          b.rows.push_back(r.row);
          b.dense.push_back(dense);
          ++loaded;
          if (b.keys.size() >= 65536) flush(lane);
          return Status::OK();
        }));
      }
    }
    for (uint32_t l = 0; l < nl; ++l) flush(l);
    LOG(INFO) << "restored " << loaded << " rows/chunks from " << dir << " (" << old_servers
              << " servers)";
    // Release the guard.
    if (p->remaining.fetch_sub(1) == 1) {
      Status st;
      {
        std::lock_guard<std::mutex> l(p->mu);
        st = p->status;
      }
      if (st.ok()) {
        ReplyOk(std::move(p->identity), p->header);
      } else {
        ReplyError(std::move(p->identity), p->header, st);
      }
    }
    return Status::OK();
  }

  // Serving export: values only, of every row (full) or of the rows updated since this
  // server's previous export (delta; rows updated in that export's second are included again).
  Status ExportOp(const std::shared_ptr<Pending>& p) {
    const Header& h = p->header;
    if (h.name.empty()) return Status::InvalidArgument("export without a directory");
    const bool delta = h.count == 1;
    uint32_t since = 0;
    if (delta) {
      // The base export (version h.offset, a sibling directory) recorded when it started on
      // this server; the delta holds the rows updated since then.
      const std::string base =
          std::filesystem::path(h.name).parent_path().string() + "/v" + std::to_string(h.offset);
      TESSERA_ASSIGN_OR_RETURN(auto info, ReadBlobs(ServerDir(base, options_.rank) + "/manifest"));
      if (info.size() < 5)
        return Status::Corruption("the manifest of '" + base + "' is incomplete");
      TESSERA_ASSIGN_OR_RETURN(uint64_t t, ParseStoredNumber(info[4], "export start time"));
      since = static_cast<uint32_t>(t);
    }
    const uint32_t now = NowSeconds();
    const std::string dir = ServerDir(h.name, options_.rank);
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) return Status::IOError("cannot create '" + dir + "': " + ec.message());
    std::vector<std::pair<uint64_t, TableSpec>> tables;
    std::vector<std::string> specs;
    for (auto& [id, t] : tables_) {
      tables.emplace_back(id, t.spec);
      specs.push_back(EncodeTableSpec(t.spec));
    }
    TESSERA_RETURN_IF_ERROR(WriteBlobs(dir + "/tables", specs));
    TESSERA_RETURN_IF_ERROR(
        WriteBlobs(dir + "/manifest",
                   {std::to_string(options_.rank), std::to_string(options_.num_servers),
                    std::to_string(since), std::to_string(lanes_.size()), std::to_string(now)}));
    SnapshotOptions so;
    so.values_only = true;
    so.min_update_s = since;
    RunOnAllLanes(
        p,
        [dir, tables, so](Lane& lane) {
          return WriteLaneSnapshot(lane.store(), tables,
                                   dir + "/lane-" + std::to_string(lane.index()), so);
        },
        false);
    return Status::OK();
  }

  struct CutState {
    int64_t cut;
    uint32_t num_workers;
    std::string dir;
    std::shared_ptr<Pending> request;
  };

  const ServerOptions options_;
  zmq::context_t ctx_;
  zmq::socket_t router_;   // I/O thread only (after Start)
  zmq::socket_t replies_;  // I/O thread only
  SlotMap slot_map_;
  std::string endpoint_;
  std::unique_ptr<StorageEngine> engine_;
  std::vector<std::unique_ptr<Lane>> lanes_;
  std::unique_ptr<FileWriter> writer_;
  std::thread io_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> stopped_{false};

  // State below is owned by the I/O thread.
  absl::flat_hash_map<uint64_t, TableInfo> tables_;
  absl::flat_hash_map<std::string, uint64_t> names_;
  absl::flat_hash_map<uint32_t, int64_t> clocks_;
  std::vector<std::shared_ptr<Pending>> parked_;
  std::map<std::string, std::vector<BarrierWait>> barriers_;
  uint64_t requests_ = 0, errors_ = 0, pushes_ = 0, push_keys_ = 0, pulls_ = 0, pull_keys_ = 0,
           parked_total_ = 0;
  uint32_t job_workers_ = 0;
  uint64_t log_seq_ = 0;        // last request-log sequence number assigned
  uint64_t truncated_seq_ = 0;  // log truncated up to here
  int64_t max_push_clock_ = -1;
  std::optional<CutState> cut_;
  std::vector<std::shared_ptr<Pending>> cut_parked_;
};

}  // namespace internal

Result<std::unique_ptr<Server>> Server::Create(const ServerOptions& options) {
  auto impl = std::make_unique<internal::ServerImpl>(options);
  TESSERA_RETURN_IF_ERROR(impl->Start());
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

Server::Server(std::unique_ptr<internal::ServerImpl> impl) : impl_(std::move(impl)) {}
Server::~Server() { Shutdown(); }
const std::string& Server::endpoint() const { return impl_->endpoint(); }
void Server::Shutdown() { impl_->Shutdown(); }

}  // namespace tessera
