// Write-back of the RocksDB engine (docs/storage.md): a lane hands its dirty rows and its
// applied-log mark off to the engine's writer thread (RocksDbLaneStore::HandOff), which writes
// rounds of hand-offs and flushes every memtable (RocksDbEngine::WriteRound); the lane then
// reaps the result (RocksDbLaneStore::Reap): rows unpinned, or dirty again after a failure.
#include <glog/logging.h>
#include <rocksdb/db.h>
#include <rocksdb/write_batch.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <vector>

#include "ps/routing.h"
#include "ps/thread_name_internal.h"
#include "storage/rocksdb_common_internal.h"
#include "storage/rocksdb_engine_impl_internal.h"
#include "storage/rocksdb_lane_store_internal.h"
#include "storage/rocksdb_write_back_internal.h"
#include "storage/row_cache_internal.h"
#include "storage/row_codec_internal.h"

namespace tessera::internal {
namespace {

// A WriteBatch record's bytes beyond its key and value, at most: tag, column family, lengths.
constexpr size_t kBatchRecordBytes = 10;

// A sparse row's place in a write-back batch: its encoded key's bytes (slot prefix, then the key,
// big-endian), compared as two integers, and where its record is (`pos`). Sorting by it puts
// the rows in the memtable's key order.
struct KeyOrder {
  uint64_t hi;  // key bytes 0..7, big-endian: slot and the key's high 48 bits
  uint32_t lo;  // key bytes 8..9
  uint32_t pos;
  static KeyOrder Of(const internal::SparseKey& k, uint32_t pos) {
    return {internal::GetBigEndian64(k.bytes),
            (uint32_t{static_cast<uint8_t>(k.bytes[8])} << 8) | static_cast<uint8_t>(k.bytes[9]),
            pos};
  }
  bool operator<(const KeyOrder& o) const { return hi != o.hi ? hi < o.hi : lo < o.lo; }
};

}  // namespace

Status WriteBackJob::AppendSortedRows() {
  std::vector<KeyOrder> order;
  for (size_t f = 0; f < used_families; ++f) {
    Family& fam = families[f];
    // Encoded in arena order, so that each block goes back to the lane as soon as it is read
    // (a push to a block still held copies it).
    const size_t rec = internal::kSparseKeyBytes + internal::RowBytes(fam.floats);
    char* const records_at = Records(fam.slots.size() * rec);
    order.clear();
    char* out = records_at;
    fam.frozen.VisitAndRelease(fam.slots, [&](uint32_t slot) {
      const auto k = internal::EncodeSparseKey(fam.frozen.key(slot));
      std::memcpy(out, k.bytes, internal::kSparseKeyBytes);
      internal::EncodeRowTo(fam.frozen.row(slot), fam.floats, fam.frozen.meta(slot),
                            out + internal::kSparseKeyBytes);
      order.push_back(KeyOrder::Of(k, static_cast<uint32_t>(order.size())));
      out += rec;
    });
    std::sort(order.begin(), order.end());
    for (const KeyOrder& o : order) {
      const char* r = records_at + size_t{o.pos} * rec;
      auto s =
          batch.Put(fam.cf, rocksdb::Slice(r, internal::kSparseKeyBytes),
                    rocksdb::Slice(r + internal::kSparseKeyBytes, rec - internal::kSparseKeyBytes));
      if (!s.ok()) return FromRocks(s, "building the write-back batch");  // Reap releases
    }
  }
  TrimBuffers(/*batch_too=*/false);
  return Status::OK();
}

rocksdb::Status WriteBackJob::CopySortedRows(const CachedRows& rows,
                                             rocksdb::ColumnFamilyHandle* cf,
                                             std::span<const uint32_t> slots) {
  std::vector<KeyOrder> order(slots.size());
  for (size_t i = 0; i < slots.size(); ++i) {
    order[i] = KeyOrder::Of(internal::EncodeSparseKey(rows.header(slots[i]).key), slots[i]);
  }
  std::sort(order.begin(), order.end());
  const size_t row_bytes = internal::RowBytes(rows.floats());
  char* const row = Records(row_bytes);
  for (const KeyOrder& o : order) {
    const auto k = internal::EncodeSparseKey(rows.header(o.pos).key);
    internal::EncodeRowTo(rows.row(o.pos), rows.floats(), rows.header(o.pos).meta, row);
    auto s = batch.Put(cf, rocksdb::Slice(k.bytes, internal::kSparseKeyBytes),
                       rocksdb::Slice(row, row_bytes));
    if (!s.ok()) return s;
  }
  return rocksdb::Status::OK();
}

void WriteBackJob::TrimBuffers(bool batch_too) {
  // Large buffers go back to the system between hand-offs (they are mmap'd chunks): kept, two
  // copies of the largest hand-off stayed in every lane's memory for good.
  constexpr size_t kKeepBytes = size_t{1} << 20;
  if (records_capacity > kKeepBytes) {
    records.reset();
    records_capacity = 0;
  }
  if (batch_too && batch.GetDataSize() > kKeepBytes) batch = rocksdb::WriteBatch();
}

// ------------------------------------------------------------------------------------ engine
void RocksDbEngine::Submit(std::shared_ptr<WriteBackJob> job) {
  {
    MutexLock l(writer_mu_);
    jobs_.push_back(std::move(job));
  }
  writer_cv_.notify_one();
}

void RocksDbEngine::WriterLoop() {
  NameThisThread("write-back");
  std::vector<std::shared_ptr<WriteBackJob>> round;
  const auto interval = std::chrono::milliseconds(options_.row_flush_interval_ms);
  for (;;) {
    bool flush_due = false;
    {
      MutexLock l(writer_mu_);
      // Rounds written and not flushed yet are flushed at most `interval` after the first one.
      while (!writer_stop_ && jobs_.empty()) {
        if (written_round_ == flushed_round()) {
          writer_cv_.wait(l.native());
        } else if (writer_cv_.wait_until(l.native(), first_unflushed_ + interval) ==
                       std::cv_status::timeout &&
                   jobs_.empty()) {
          flush_due = !writer_stop_;
          break;
        }
      }
      if (!flush_due && jobs_.empty()) return;  // stopping, nothing left (the lanes committed)
      round.swap(jobs_);
    }
    if (flush_due) {
      Status s = FlushRounds();
      if (!s.ok()) {
        LOG(WARNING) << "write-back flush: " << s.ToString();
        first_unflushed_ = std::chrono::steady_clock::now();  // tried again an interval later
      }
      continue;
    }
    WriteRound(round);
    round.clear();
  }
}

Status RocksDbEngine::FlushRounds() {
  Status s = FlushMemtables();
  resume_ = !s.ok();
  if (s.ok()) {
    flushed_round_.store(written_round_, std::memory_order_release);
    flush_soon_ = false;
  }
  return s;
}

void RocksDbEngine::WriteRound(std::vector<std::shared_ptr<WriteBackJob>>& round) {
  Status s;
  if (resume_) {
    // The last round failed and RocksDB may refuse writes until it recovers (space freed).
    // Busy: its own recovery runs; the writes below tell whether it is done.
    const rocksdb::Status r = db_->Resume();
    if (!r.ok() && !r.IsBusy()) {
      s = FromRocks(r, "resuming '" + options_.data_dir + "' after a failed write");
    }
  }
  // Write-ahead: the rows carry their lanes' applied marks, so every log entry up to them must
  // be in the log file first. In relaxed mode entries wait in the log's buffer; a mark stored
  // ahead of the file, then a kill -9, left the next entry after a gap that made every later
  // start fail (Corruption: record N follows M).
  if (s.ok() && log_file_ != nullptr) s = log_file_->Flush();
  const bool was_flushed = written_round_ == flushed_round();
  const uint64_t id = ++written_round_;
  bool flush = options_.row_flush_interval_ms == 0;
  for (auto& job : round) {
    job->round = id;
    flush |= job->flush;
    flush_soon_ |= job->flush_soon;
    if (s.ok()) s = job->AppendSortedRows();
    if (s.ok()) s = WriteRows(&job->batch);
    // In the memtables now (or failed: Reap marks the rows dirty again): the batch's bytes go
    // before the flush, not after the round.
    job->TrimBuffers(/*batch_too=*/true);
  }
  const auto now = std::chrono::steady_clock::now();
  if (was_flushed) first_unflushed_ = now;
  flush |= now - first_unflushed_ >= std::chrono::milliseconds(options_.row_flush_interval_ms);
  if (flush_soon_ && !flush) {
    // A lane's periodic hand-off: flushed once the hand-offs queued meanwhile are written too
    // (the lanes come due at the same instants), so that one flush covers them all.
    MutexLock l(writer_mu_);
    flush = jobs_.empty();
  }
  // Rows went in without the WAL: they and their marks are durable once every memtable is
  // flushed, atomically across the column families (atomic_flush; RocksDB's own flushes, when
  // the memtables are full, are atomic too). Until then the lanes read them from the memtables.
  if (s.ok() && flush) s = FlushRounds();
  resume_ = !s.ok();
  if (!s.ok()) LOG(WARNING) << "write-back: " << s.ToString();
  const uint64_t flushed = flushed_round();
  for (auto& job : round) {
    job->error = s;
    job->durable = flushed >= job->round;
    job->state.store(s.ok() ? WriteBackJob::kDone : WriteBackJob::kFailed,
                     std::memory_order_release);
    job->state.notify_all();
  }
}

// ------------------------------------------------------------------------------------ lane
bool RocksDbLaneStore::HasDirty() const {
  for (const auto& [id, t] : tables_) {
    if (!t->dirty_slots.empty() || !t->dirty_chunks.empty()) return true;
  }
  return false;
}

size_t RocksDbLaneStore::WriteBackBytes() const {
  size_t bytes = 64;  // the lane mark
  for (const auto& [id, t] : tables_) {
    if (t->rows) {
      bytes += t->dirty_slots.size() *
               (internal::kSparseKeyBytes + internal::RowBytes(t->floats) + kBatchRecordBytes);
    }
    bytes += t->dirty_chunks.size() *
             (internal::kDenseKeyBytes +
              internal::RowBytes(static_cast<uint32_t>(kDenseChunkFloats * (1 + t->floats))) +
              kBatchRecordBytes);
  }
  return bytes;
}

uint64_t RocksDbLaneStore::dirty_bytes() const {
  uint64_t bytes = 0;
  for (const auto& [id, t] : tables_) {
    if (t->rows) bytes += (t->dirty_slots.size() + t->flight_slots.size()) * t->rows->slot_bytes();
    // Dense: t->floats is the state per element.
    bytes += (t->dirty_chunks.size() + t->flight_chunks.size()) * sizeof(float) *
             kDenseChunkFloats * (1 + t->floats);
  }
  return bytes;
}

Status RocksDbLaneStore::HandOff(bool flush, bool flush_soon) {
  std::shared_ptr<WriteBackJob> job = std::move(spare_);
  if (job) {
    job->Reset();
  } else {
    job = std::make_shared<WriteBackJob>();
  }
  job->flush = flush;
  job->flush_soon = flush_soon;
  // Reserved at its final size (a WriteBatch grows by doubling: the copies and page faults of a
  // million-row write-back were a fifth of the writer's time). Allocated here, touched by
  // whoever encodes the rows.
  job->batch = rocksdb::WriteBatch(WriteBackBytes());
  // The applied-log mark goes in the same batch as the rows it describes.
  auto s = job->batch.Put(engine_->meta_cf(), LaneMarkKey(lane_, num_lanes_), SeqKey(applied_seq_));
  uint64_t rows = 0;
  for (auto& [id, t] : tables_) {
    rows += t->dirty_slots.size() + t->dirty_chunks.size();
    if (!t->dirty_slots.empty()) {
      if (budget_ != 0) {
        // Copied here, into the batch: the rows' bytes come out of the budget's reserve.
        if (s.ok()) s = job->CopySortedRows(*t->rows, t->cf, t->dirty_slots);
      } else {
        // No row is copied here: the writer encodes them from the frozen arena, and a push that
        // changes one meanwhile copies its block.
        WriteBackJob::Family& f = job->NextFamily(t->cf, t->floats);
        f.frozen = t->rows->Freeze();
        f.slots.assign(t->dirty_slots.begin(), t->dirty_slots.end());
      }
      // The rows stay pinned (in flight) until Reap.
      t->rows->BeginFlight();
      t->flight_slots.swap(t->dirty_slots);  // flight_slots was empty: reaped before
    }
    for (uint64_t chunk : t->dirty_chunks) {
      DenseChunk& c = t->dense.at(chunk);
      internal::EncodeRow(c.data.data(), static_cast<uint32_t>(c.data.size()), c.meta,
                          &encode_buf_);
      const auto key = internal::EncodeDenseKey(chunk);
      if (s.ok()) {
        s = job->batch.Put(t->cf, rocksdb::Slice(key.bytes, internal::kDenseKeyBytes), encode_buf_);
      }
      c.dirty = false;
      t->flight_chunks.push_back(chunk);
    }
    t->dirty_slots.clear();
    t->dirty_chunks.clear();
  }
  flight_ = job;
  flight_seq_ = applied_seq_;
  flight_rows_ = rows;
  if (!s.ok()) {
    // A batch RocksDB cannot hold (over its 4 GiB limit): nothing goes out, rows stay dirty.
    job->error = FromRocks(s, "building the write-back batch");
    job->state.store(WriteBackJob::kFailed);
    return Reap();
  }
  engine_->Submit(std::move(job));
  return Status::OK();
}

Status RocksDbLaneStore::Reap() {
  std::shared_ptr<WriteBackJob> job = std::move(flight_);
  const bool ok = job->state.load(std::memory_order_acquire) == WriteBackJob::kDone;
  job->ReleaseRows();  // when the writer failed before encoding them
  for (auto& [id, t] : tables_) {
    if (t->rows) {
      if (!ok) {
        for (uint32_t slot : t->flight_slots) MarkDirty(t.get(), slot);  // pinned: not moved
      }
      t->rows->EndFlight();
    }
    t->flight_slots.clear();
    // No slot numbers are held now (unless rows changed again meanwhile): rows may move.
    if (t->rows && t->dirty_slots.empty()) CompactRows(t.get());
    if (!ok) {
      for (uint64_t chunk : t->flight_chunks) MarkChunkDirty(t.get(), chunk, &t->dense.at(chunk));
    }
    t->flight_chunks.clear();
  }
  const Status error = job->error;
  const bool durable = job->durable;
  const uint64_t round = job->round;
  spare_ = std::move(job);
  if (!ok) return error;
  // In the memtables now, where reads find them: the rows need not stay pinned. The mark is
  // durable once the writer has flushed the round.
  written_seq_ = flight_seq_;
  ++stats_.commits;
  stats_.rows_written += flight_rows_;
  if (durable) {
    committed_seq_ = flight_seq_;
    unflushed_.clear();  // a flush covers every earlier round
  } else {
    unflushed_.push_back({round, flight_seq_});
  }
  PruneUnflushed();
  return Status::OK();
}

void RocksDbLaneStore::PruneUnflushed() {
  const uint64_t flushed = engine_->flushed_round();
  while (!unflushed_.empty() && unflushed_.front().round <= flushed) {
    committed_seq_ = unflushed_.front().seq;
    unflushed_.pop_front();
  }
}

uint64_t RocksDbLaneStore::committed_seq() const {
  uint64_t seq = committed_seq_;
  const uint64_t flushed = engine_->flushed_round();
  for (const Unflushed& u : unflushed_) {
    if (u.round > flushed) break;
    seq = u.seq;
  }
  return seq;
}

Status RocksDbLaneStore::WriteBack(bool wait, bool flush_soon) {
  Status reaped;
  if (flight_) {
    if (!wait && flight_->state.load(std::memory_order_acquire) == WriteBackJob::kQueued) {
      return Status::OK();  // one hand-off at a time
    }
    flight_->Wait();
    reaped = Reap();
  }
  PruneUnflushed();
  if (!HasDirty() && applied_seq_ == written_seq_) return reaped;
  Status s = HandOff(/*flush=*/false, flush_soon);
  return reaped.ok() ? s : reaped;
}

Status RocksDbLaneStore::Commit() {
  if (flight_) {
    // A failed hand-off's rows are dirty again: they go out with the one below.
    flight_->Wait();
    (void)Reap();
  }
  PruneUnflushed();
  if (!HasDirty() && applied_seq_ == committed_seq_) return Status::OK();
  // Rows written back but not flushed yet are made durable by this hand-off's flush too (it
  // carries at least the mark).
  Status s = HandOff(/*flush=*/true, /*flush_soon=*/false);
  if (!s.ok() || !flight_) return s;
  flight_->Wait();
  return Reap();
}

}  // namespace tessera::internal
