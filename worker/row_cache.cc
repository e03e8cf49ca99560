#include "worker/row_cache.h"

#include <absl/container/flat_hash_map.h>

#include <algorithm>
#include <atomic>
#include <string>
#include <utility>
#include <vector>

#include "ps/mutex.h"

namespace tessera::worker {
namespace {

// Inner pushes of deferred gradients issued together (one Clock(), one eviction, one Flush).
// `done` is set by whoever waits for them first.
struct FlushBatch {
  Pending pending;
  std::atomic<bool> done{false};
  Status Wait() {
    Status s = pending.Wait();
    done.store(true, std::memory_order_release);
    return s;
  }
  bool is_done() const { return done.load(std::memory_order_acquire); }
};
using BatchPtr = std::shared_ptr<FlushBatch>;

// One held row. Its value and gradient sum live in TableCache::values / grads at slot * dim.
struct Slot {
  uint64_t key = 0;
  uint32_t count = 0;       // pulls of the key in the counting window
  bool used = false;        // holds a key
  bool valid = false;       // the value is filled
  bool dirty = false;       // the gradient sum holds gradients not yet pushed
  int64_t value_tick = 0;   // tick of the inner pull that fetched the value
  int64_t flush_tick = 0;   // dirty: the tick whose Clock() pushes the sum
  uint64_t fill = 0;        // ticket of the pull that fills the value; 0: none
  int64_t fill_tick = 0;    // fill != 0: the tick that pull was issued at
  Pending fill_pending;     // fill != 0: that pull's completion (once its Pull returned)
  uint64_t pull_stamp = 0;  // the last Pull call that asked for it (not evicted by that call)
  BatchPtr flushing;        // the push of its last flushed sum, until seen acknowledged
};

// Keys ahead whose hash-table group is fetched into the cache while this one is looked up: the
// tables are far larger than the CPU's caches, and most lookups would wait for memory.
constexpr size_t kPrefetch = 8;

struct TableCache {
  uint32_t dim = 0;
  std::vector<Slot> slots;
  std::vector<float> values, grads;                          // slots.size() * dim each
  std::vector<int32_t> free;                                 // unused slots
  absl::flat_hash_map<uint64_t, int32_t> held;               // key -> slot
  absl::flat_hash_map<uint64_t, uint32_t> counts;            // pull counts of keys not held
  absl::flat_hash_map<uint64_t, BatchPtr> evicted_flushing;  // evicted rows' pushes in flight
  std::vector<std::vector<int32_t>> due;                     // slots by flush_tick % (S + 1)
};

// A fetch into a row: miss `index` of the pull fills `slot` if the slot's ticket is still
// `ticket` when the values arrive.
struct Fill {
  uint32_t index;
  int32_t slot;
  uint64_t ticket;
};

// A key of a pull served by an earlier pull's fetch of its row (`lender`, still in flight).
struct Join {
  uint32_t at;  // its position in the pull's keys
  int32_t slot;
  uint64_t key;
  Pending lender;
};

// What a pull sent to the inner store, kept until its values arrive.
struct PullMisses {
  int64_t tick = 0;
  uint32_t dim = 0;
  std::vector<uint64_t> keys;
  std::vector<uint32_t> at;  // their positions in the pull's keys
  std::vector<Fill> fills;
  std::vector<Join> joins;
  bool direct = false;     // every key a miss: the inner store wrote `out`
  std::vector<float> buf;  // otherwise its values, in the order of `keys`
  Pending inner;
};

class CachingStoreImpl final : public CachingStore {
 public:
  CachingStoreImpl(ParamStore* inner, const RowCacheOptions& o)
      : inner_(inner),
        rows_(o.rows),
        s_(o.staleness),
        admit_count_(o.admit_count),
        counted_keys_(o.counted_keys != 0 ? o.counted_keys : 8 * o.rows + 65536) {}

  Result<uint32_t> AddTable(const TableSpec& spec) override {
    TESSERA_ASSIGN_OR_RETURN(uint32_t id, inner_->AddTable(spec));
    MutexLock lock(mu_);
    if (tables_.size() <= id) tables_.resize(id + 1);
    if (spec.kind == TableKind::kSparse && tables_[id] == nullptr) {
      auto t = std::make_unique<TableCache>();
      t->dim = spec.dim;
      t->due.resize(static_cast<size_t>(s_) + 1);
      tables_[id] = std::move(t);
    }
    return id;
  }

  Pending Pull(uint32_t table, std::span<const uint64_t> keys, float* out) override;
  Pending Push(uint32_t table, std::span<const uint64_t> keys,
               std::span<const float> grads) override;
  Pending Clock() override;
  Status Flush() override;
  RowCacheStats stats() const override {
    MutexLock lock(mu_);
    RowCacheStats s = stats_;
    for (const auto& t : tables_) {
      if (t) {
        s.rows += t->held.size();
        s.counted_keys += t->counts.size();
      }
    }
    return s;
  }

  Pending DensePull(uint32_t table, uint64_t offset, uint64_t length, float* out) override {
    return inner_->DensePull(table, offset, length, out);
  }
  Pending DensePush(uint32_t table, uint64_t offset, std::span<const float> grads) override {
    return inner_->DensePush(table, offset, grads);
  }
  int64_t clock() const override { return inner_->clock(); }
  Status SetClock(int64_t clock) override { return inner_->SetClock(clock); }
  // After a barrier, every worker's deferred gradients are on the servers.
  Status Barrier(const std::string& name) override {
    TESSERA_RETURN_IF_ERROR(Flush());
    return inner_->Barrier(name);
  }
  Status PutMeta(const std::string& name, std::string_view value) override {
    return inner_->PutMeta(name, value);
  }
  Result<std::optional<std::string>> GetMeta(const std::string& name) override {
    return inner_->GetMeta(name);
  }
  Status SetLearningRateScale(float scale) override { return inner_->SetLearningRateScale(scale); }

 private:
  TableCache* Find(uint32_t table) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return table < tables_.size() ? tables_[table].get() : nullptr;
  }
  // Waits (holding mu_: the push needs nothing of this store) for a flush still in flight.
  void WaitFlushing(BatchPtr* b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (*b == nullptr) return;
    if (!(*b)->is_done()) {
      ++stats_.flush_waits;
      (void)(*b)->Wait();  // an error reaches the caller through Clock() or Flush()
    }
    b->reset();
  }
  void Locate(TableCache* t, std::span<const uint64_t> keys, uint64_t stamp)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Serve(TableCache* t, std::span<const uint64_t> keys, float* out, uint64_t stamp,
             int64_t tick, PullMisses* m, std::vector<uint64_t>* ev_keys,
             std::vector<float>* ev_grads) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Status FinishMisses(uint32_t table, float* out, PullMisses* m) ABSL_LOCKS_EXCLUDED(mu_);
  Status FinishJoins(uint32_t table, float* out, PullMisses* m) ABSL_LOCKS_EXCLUDED(mu_);
  int32_t Admit(TableCache* t, uint64_t key, uint32_t count, uint64_t stamp,
                std::vector<uint64_t>* ev_keys, std::vector<float>* ev_grads)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AddToSum(TableCache* t, int32_t slot, const float* g) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Halve(TableCache* t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves slot's sum into keys/grads (the caller pushes them) and marks it clean.
  void TakeSum(TableCache* t, int32_t slot, std::vector<uint64_t>* keys, std::vector<float>* grads)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Pushes `keys`/`grads` of table `id` as one batch; records it as outstanding.
  BatchPtr PushBatch(uint32_t id, std::vector<uint64_t> keys, std::vector<float> grads)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t NextRandom() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    rng_ ^= rng_ << 13;
    rng_ ^= rng_ >> 7;
    rng_ ^= rng_ << 17;
    return rng_;
  }

  ParamStore* const inner_;
  const uint64_t rows_;
  const int32_t s_;
  const uint32_t admit_count_;
  const uint64_t counted_keys_;
  mutable Mutex mu_;
  std::vector<std::unique_ptr<TableCache>> tables_ ABSL_GUARDED_BY(mu_);
  int64_t ticks_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t stamp_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t ticket_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t rng_ ABSL_GUARDED_BY(mu_) = 0x9e3779b97f4a7c15ull;
  // Batches not yet reported by a Clock() (evictions), and all not yet seen acknowledged.
  std::vector<BatchPtr> unreported_ ABSL_GUARDED_BY(mu_);
  std::vector<BatchPtr> outstanding_ ABSL_GUARDED_BY(mu_);
  std::vector<int32_t> scratch_slots_ ABSL_GUARDED_BY(mu_);  // Pull's and Push's, reused
  std::vector<uint32_t> scratch_counts_ ABSL_GUARDED_BY(mu_);
  RowCacheStats stats_ ABSL_GUARDED_BY(mu_);
};

void CachingStoreImpl::TakeSum(TableCache* t, int32_t slot, std::vector<uint64_t>* keys,
                               std::vector<float>* grads) {
  Slot& s = t->slots[slot];
  // A row's flushes reach the inner store in order: the previous one first (in practice
  // acknowledged long before, a tick or more ago).
  WaitFlushing(&s.flushing);
  float* g = t->grads.data() + static_cast<size_t>(slot) * t->dim;
  keys->push_back(s.key);
  grads->insert(grads->end(), g, g + t->dim);
  std::fill(g, g + t->dim, 0.0f);
  s.dirty = false;
  --stats_.deferred_rows;
  ++stats_.flushed_rows;
}

BatchPtr CachingStoreImpl::PushBatch(uint32_t id, std::vector<uint64_t> keys,
                                     std::vector<float> grads) {
  auto b = std::make_shared<FlushBatch>();
  b->pending = inner_->Push(id, keys, grads);
  ++stats_.flushes;
  outstanding_.push_back(b);
  return b;
}

// Sampled LFU: the least frequent of a few held rows not asked for by this pull gives way to a
// more frequent key. Returns the slot, or -1 when the key is not admitted.
int32_t CachingStoreImpl::Admit(TableCache* t, uint64_t key, uint32_t count, uint64_t stamp,
                                std::vector<uint64_t>* ev_keys, std::vector<float>* ev_grads) {
  if (count < admit_count_) return -1;
  int32_t slot = -1;
  if (!t->free.empty()) {
    slot = t->free.back();
    t->free.pop_back();
  } else if (t->slots.size() < rows_) {
    slot = static_cast<int32_t>(t->slots.size());
    t->slots.emplace_back();
    t->values.resize(t->slots.size() * t->dim);
    t->grads.resize(t->slots.size() * t->dim);
  } else {
    constexpr int kSamples = 5;
    int32_t victim = -1;
    uint32_t victim_count = count;
    for (int i = 0; i < kSamples; ++i) {
      const int32_t c = static_cast<int32_t>(NextRandom() % t->slots.size());
      const Slot& s = t->slots[c];
      if (!s.used || s.pull_stamp == stamp) continue;
      if (s.count < victim_count) {
        victim = c;
        victim_count = s.count;
      }
    }
    if (victim < 0) return -1;
    Slot& v = t->slots[victim];
    if (v.dirty) {
      TakeSum(t, victim, ev_keys, ev_grads);  // the caller pushes it and marks the key
    } else if (v.flushing != nullptr && !v.flushing->is_done()) {
      t->evicted_flushing[v.key] = v.flushing;
    }
    t->held.erase(v.key);
    t->counts[v.key] = v.count;  // counted on while not held
    ++stats_.evictions;
    slot = victim;
  }
  Slot& s = t->slots[slot];
  s = Slot{};
  s.key = key;
  s.count = count;
  s.used = true;
  t->counts.erase(key);
  t->held[key] = slot;
  return slot;
}

void CachingStoreImpl::Halve(TableCache* t) {
  while (t->counts.size() > counted_keys_) {
    for (auto it = t->counts.begin(); it != t->counts.end();) {
      it->second >>= 1;
      if (it->second == 0) {
        t->counts.erase(it++);
      } else {
        ++it;
      }
    }
    for (Slot& s : t->slots) s.count >>= 1;  // held keys age alike
  }
}

// Passes 1 and 2 of a pull (Pull): counts, where each key is held (scratch_slots_; the counts
// of keys not held in scratch_counts_), and this pull's stamp on its held rows, which
// admissions must not evict. Each pass fetches the memory of the keys a few ahead: the tables
// are far larger than the CPU's caches.
void CachingStoreImpl::Locate(TableCache* t, std::span<const uint64_t> keys, uint64_t stamp) {
  const size_t n = keys.size();
  std::vector<int32_t>& slot_of = scratch_slots_;
  std::vector<uint32_t>& count_of = scratch_counts_;
  slot_of.resize(n);
  count_of.resize(n);
  for (size_t i = 0; i < n; ++i) {
    if (i + kPrefetch < n) t->held.prefetch(keys[i + kPrefetch]);
    auto it = t->held.find(keys[i]);
    if (it != t->held.end()) {
      slot_of[i] = it->second;
    } else {
      slot_of[i] = -1;
      uint32_t& c = t->counts[keys[i]];
      if (c < UINT32_MAX) ++c;
      count_of[i] = c;
    }
  }
  for (size_t i = 0; i < n; ++i) {
    if (i + kPrefetch < n && slot_of[i + kPrefetch] >= 0) {
      __builtin_prefetch(&t->slots[slot_of[i + kPrefetch]]);
    }
    if (slot_of[i] < 0) continue;
    Slot& s = t->slots[slot_of[i]];
    if (s.count < UINT32_MAX) ++s.count;
    s.pull_stamp = stamp;
  }
}

// Pass 3 of a pull: hits into `out`; refetches, admissions and plain misses into `m`.
void CachingStoreImpl::Serve(TableCache* t, std::span<const uint64_t> keys, float* out,
                             uint64_t stamp, int64_t tick, PullMisses* m,
                             std::vector<uint64_t>* ev_keys, std::vector<float>* ev_grads) {
  const uint32_t dim = t->dim;
  const std::vector<int32_t>& slot_of = scratch_slots_;
  bool admitted = false;
  const uint64_t first_ticket = ticket_ + 1;  // tickets below it: earlier pulls' fetches
  for (size_t i = 0; i < keys.size(); ++i) {
    if (i + kPrefetch < keys.size() && slot_of[i + kPrefetch] >= 0) {
      __builtin_prefetch(t->values.data() + static_cast<size_t>(slot_of[i + kPrefetch]) * dim);
    }
    const uint64_t key = keys[i];
    int32_t slot = slot_of[i];
    if (slot < 0 && admitted) {  // a key repeated in this pull may be held by now
      auto it = t->held.find(key);
      if (it != t->held.end()) slot = it->second;
    }
    if (slot >= 0) {
      Slot& s = t->slots[slot];
      if (s.valid && tick - s.value_tick <= s_) {
        const float* v = t->values.data() + static_cast<size_t>(slot) * dim;
        std::copy(v, v + dim, out + i * dim);
        ++stats_.hits;
        continue;
      }
      if (!s.valid && s.fill != 0 && s.fill < first_ticket && tick - s.fill_tick <= s_) {
        // An earlier pull's fetch of the row is in flight and its value will be fresh enough.
        m->joins.push_back({static_cast<uint32_t>(i), slot, key, s.fill_pending});
        ++stats_.hits;
        ++stats_.joined;
        continue;
      }
      // Too old, or not filled yet: fetch it again, once its flushed sum is on the servers.
      WaitFlushing(&s.flushing);
      s.valid = false;
    } else {
      if (!t->evicted_flushing.empty()) {
        auto it = t->evicted_flushing.find(key);
        if (it != t->evicted_flushing.end()) {
          WaitFlushing(&it->second);
          t->evicted_flushing.erase(it);
        }
      }
      slot = Admit(t, key, scratch_counts_[i], stamp, ev_keys, ev_grads);
      if (slot >= 0) {
        admitted = true;
        t->slots[slot].pull_stamp = stamp;
      }
    }
    if (slot >= 0) {
      t->slots[slot].fill = ++ticket_;
      m->fills.push_back({static_cast<uint32_t>(m->keys.size()), slot, t->slots[slot].fill});
    }
    m->keys.push_back(key);
    m->at.push_back(static_cast<uint32_t>(i));
  }
}

// Once the inner pull of `m` is done: its values into `out` at their keys' positions, and into
// the rows it fetched that still wait for them.
Status CachingStoreImpl::FinishMisses(uint32_t table, float* out, PullMisses* m) {
  if (Status st = m->inner.Wait(); !st.ok()) {
    MutexLock lock(mu_);  // the rows it was to fill are fetched again by the next pull
    TableCache* t = Find(table);
    for (const Fill& f : m->fills) {
      Slot& s = t->slots[f.slot];
      if (s.used && s.fill == f.ticket) {
        s.fill = 0;
        s.fill_pending = Pending();
      }
    }
    return st;
  }
  const uint32_t dim = m->dim;
  const float* got = m->direct ? out : m->buf.data();
  if (!m->direct) {
    for (size_t k = 0; k < m->at.size(); ++k) {
      std::copy(got + k * dim, got + (k + 1) * dim, out + static_cast<size_t>(m->at[k]) * dim);
    }
  }
  MutexLock lock(mu_);
  TableCache* t = Find(table);
  for (const Fill& f : m->fills) {
    Slot& s = t->slots[f.slot];
    if (!s.used || s.fill != f.ticket) continue;  // evicted, or fetched again since
    const float* v = got + static_cast<size_t>(m->direct ? m->at[f.index] : f.index) * dim;
    std::copy(v, v + dim, t->values.data() + static_cast<size_t>(f.slot) * dim);
    s.valid = true;
    s.value_tick = m->tick;
    s.fill = 0;
    s.fill_pending = Pending();
  }
  return Status::OK();
}

// Once the earlier pulls that `m` joined are done: their rows' values into `out`; rows whose
// fetch failed or that were evicted or refetched meanwhile (the value is gone, or not fresh
// enough for this pull) are fetched now.
Status CachingStoreImpl::FinishJoins(uint32_t table, float* out, PullMisses* m) {
  for (Join& j : m->joins) (void)j.lender.Wait();  // its error is its own pull's result
  const uint32_t dim = m->dim;
  std::vector<uint64_t> again;
  std::vector<uint32_t> again_at;
  {
    MutexLock lock(mu_);
    TableCache* t = Find(table);
    for (const Join& j : m->joins) {
      const Slot& s = t->slots[j.slot];
      if (s.used && s.key == j.key && s.valid && m->tick - s.value_tick <= s_) {
        const float* v = t->values.data() + static_cast<size_t>(j.slot) * dim;
        std::copy(v, v + dim, out + static_cast<size_t>(j.at) * dim);
      } else {
        again.push_back(j.key);
        again_at.push_back(j.at);
        --stats_.hits;
        --stats_.joined;
        ++stats_.misses;
      }
    }
  }
  m->joins.clear();  // drops the lenders' completions
  if (again.empty()) return Status::OK();
  std::vector<float> buf(again.size() * dim);
  TESSERA_RETURN_IF_ERROR(inner_->Pull(table, again, buf.data()).Wait());
  for (size_t k = 0; k < again.size(); ++k) {
    std::copy(buf.data() + k * dim, buf.data() + (k + 1) * dim,
              out + static_cast<size_t>(again_at[k]) * dim);
  }
  return Status::OK();
}

Pending CachingStoreImpl::Pull(uint32_t table, std::span<const uint64_t> keys, float* out) {
  MutexLock lock(mu_);
  TableCache* t = Find(table);
  if (t == nullptr) return inner_->Pull(table, keys, out);
  const uint64_t stamp = ++stamp_;
  auto m = std::make_shared<PullMisses>();
  m->tick = ticks_;
  m->dim = t->dim;
  std::vector<uint64_t> ev_keys;
  std::vector<float> ev_grads;
  Locate(t, keys, stamp);
  Serve(t, keys, out, stamp, m->tick, m.get(), &ev_keys, &ev_grads);
  stats_.misses += m->keys.size();
  if (!ev_keys.empty()) {
    std::vector<uint64_t> evicted = ev_keys;
    BatchPtr b = PushBatch(table, std::move(ev_keys), std::move(ev_grads));
    unreported_.push_back(b);
    for (uint64_t k : evicted) t->evicted_flushing[k] = b;
  }
  if (t->counts.size() > counted_keys_) Halve(t);
  if (m->keys.empty() && m->joins.empty()) return Pending();
  if (!m->keys.empty()) {
    // Every key a miss: the inner store writes `out` itself.
    m->direct = m->keys.size() == keys.size();
    if (!m->direct) m->buf.resize(m->keys.size() * m->dim);
    m->inner = inner_->Pull(table, m->keys, m->direct ? out : m->buf.data());
  }
  Pending done([this, table, out, m]() -> Status {
    Status st = FinishMisses(table, out, m.get());
    Status joins = FinishJoins(table, out, m.get());
    return st.ok() ? joins : st;
  });
  // Later pulls of the rows this one fetches may join it (Serve) until its values arrive.
  for (const Fill& f : m->fills) {
    Slot& s = t->slots[f.slot];
    if (s.used && s.fill == f.ticket) {
      s.fill_tick = m->tick;
      s.fill_pending = done;
    }
  }
  return done;
}

void CachingStoreImpl::AddToSum(TableCache* t, int32_t slot, const float* g) {
  Slot& s = t->slots[slot];
  float* sum = t->grads.data() + static_cast<size_t>(slot) * t->dim;
  for (uint32_t j = 0; j < t->dim; ++j) sum[j] += g[j];
  if (s.dirty) return;
  s.dirty = true;
  ++stats_.deferred_rows;
  // Due S ticks after this first gradient. The value expires on its own clock: a refetch that
  // comes before this flush is acknowledged waits for it (Pull).
  s.flush_tick = ticks_ + s_;
  t->due[static_cast<size_t>(s.flush_tick % (s_ + 1))].push_back(slot);
}

Pending CachingStoreImpl::Push(uint32_t table, std::span<const uint64_t> keys,
                               std::span<const float> grads) {
  MutexLock lock(mu_);
  TableCache* t = Find(table);
  if (t == nullptr) return inner_->Push(table, keys, grads);
  const uint32_t dim = t->dim;
  if (grads.size() != keys.size() * dim) {
    return Pending::Done(Status::InvalidArgument(
        "push: " + std::to_string(grads.size()) + " gradient values for " +
        std::to_string(keys.size()) + " keys of width " + std::to_string(dim)));
  }
  std::vector<uint64_t> pass_keys;
  std::vector<float> pass_grads;
  // Where each key is held, then the sums (memory fetched a few keys ahead, as in Pull).
  const size_t n = keys.size();
  std::vector<int32_t>& slot_of = scratch_slots_;
  slot_of.resize(n);
  for (size_t i = 0; i < n; ++i) {
    if (i + kPrefetch < n) t->held.prefetch(keys[i + kPrefetch]);
    auto it = t->held.find(keys[i]);
    slot_of[i] = it == t->held.end() ? -1 : it->second;
  }
  for (size_t i = 0; i < n; ++i) {
    if (i + kPrefetch < n && slot_of[i + kPrefetch] >= 0) {
      const int32_t ahead = slot_of[i + kPrefetch];
      __builtin_prefetch(&t->slots[ahead]);
      __builtin_prefetch(t->grads.data() + static_cast<size_t>(ahead) * dim);
    }
    if (slot_of[i] >= 0) {
      AddToSum(t, slot_of[i], grads.data() + i * dim);
    } else {
      pass_keys.push_back(keys[i]);
      pass_grads.insert(pass_grads.end(), grads.begin() + i * dim, grads.begin() + (i + 1) * dim);
    }
  }
  stats_.passed_keys += pass_keys.size();
  if (pass_keys.empty()) return Pending();
  // The sums the next Clock() would push ride on this push instead, a little early: one push
  // per table and step, as without the cache. (Clock() skips them: they are clean now.)
  std::vector<int32_t> riders;
  for (int32_t slot : t->due[static_cast<size_t>((ticks_ + 1) % (s_ + 1))]) {
    const Slot& s = t->slots[slot];
    if (!s.used || !s.dirty || s.flush_tick != ticks_ + 1) continue;
    TakeSum(t, slot, &pass_keys, &pass_grads);
    riders.push_back(slot);
  }
  if (riders.empty() && pass_keys.size() == keys.size()) {
    return inner_->Push(table, keys, grads);
  }
  // Input spans are copied before Push returns (ps/client/client.h; the local store applies
  // them at once).
  Pending p = inner_->Push(table, pass_keys, pass_grads);
  if (riders.empty()) return p;
  auto b = std::make_shared<FlushBatch>();
  b->pending = p;
  ++stats_.flushes;
  outstanding_.push_back(b);
  for (int32_t slot : riders) t->slots[slot].flushing = b;
  // Whoever waits for this push (the trainer's commit) marks the riders' flush acknowledged.
  return Pending([b] { return b->Wait(); });
}

Pending CachingStoreImpl::Clock() {
  MutexLock lock(mu_);
  ++ticks_;
  std::vector<BatchPtr> batches = std::move(unreported_);
  unreported_.clear();
  for (uint32_t id = 0; id < tables_.size(); ++id) {
    TableCache* t = tables_[id].get();
    if (t == nullptr) continue;
    auto& bucket = t->due[static_cast<size_t>(ticks_ % (s_ + 1))];
    std::vector<uint64_t> keys;
    std::vector<float> grads;
    std::vector<int32_t> flushed;
    for (int32_t slot : bucket) {
      const Slot& s = t->slots[slot];
      if (!s.used || !s.dirty || s.flush_tick != ticks_) continue;  // flushed or evicted since
      TakeSum(t, slot, &keys, &grads);
      flushed.push_back(slot);
    }
    bucket.clear();
    if (!keys.empty()) {
      BatchPtr b = PushBatch(id, std::move(keys), std::move(grads));
      for (int32_t slot : flushed) t->slots[slot].flushing = b;
      batches.push_back(b);
    }
    for (auto it = t->evicted_flushing.begin(); it != t->evicted_flushing.end();) {
      if (it->second->is_done()) {
        t->evicted_flushing.erase(it++);
      } else {
        ++it;
      }
    }
  }
  std::erase_if(outstanding_, [](const BatchPtr& b) { return b->is_done(); });
  // After the flushes: under bounded staleness this clock promises the step's updates.
  Pending clock = inner_->Clock();
  return Pending([clock, batches = std::move(batches)]() mutable -> Status {
    Status st = clock.Wait();
    for (BatchPtr& b : batches) {
      Status w = b->Wait();
      if (st.ok() && !w.ok()) st = w.WithContext("push of deferred gradients");
    }
    return st;
  });
}

Status CachingStoreImpl::Flush() {
  std::vector<BatchPtr> wait;
  {
    MutexLock lock(mu_);
    for (uint32_t id = 0; id < tables_.size(); ++id) {
      TableCache* t = tables_[id].get();
      if (t == nullptr) continue;
      std::vector<uint64_t> keys;
      std::vector<float> grads;
      std::vector<int32_t> flushed;
      for (int32_t slot = 0; slot < static_cast<int32_t>(t->slots.size()); ++slot) {
        if (t->slots[slot].used && t->slots[slot].dirty) {
          TakeSum(t, slot, &keys, &grads);
          flushed.push_back(slot);
        }
      }
      for (auto& bucket : t->due) bucket.clear();
      if (!keys.empty()) {
        BatchPtr b = PushBatch(id, std::move(keys), std::move(grads));
        for (int32_t slot : flushed) t->slots[slot].flushing = b;
      }
    }
    unreported_.clear();
    wait = std::move(outstanding_);
    outstanding_.clear();
  }
  Status st;
  for (BatchPtr& b : wait) {
    Status w = b->Wait();
    if (st.ok() && !w.ok()) st = w.WithContext("push of deferred gradients");
  }
  return st;
}

}  // namespace

Status ValidateRowCacheOptions(const RowCacheOptions& o) {
  if (o.rows == 0 || o.rows > kMaxCacheRows) {
    return Status::InvalidArgument("row cache: rows must be in [1, " +
                                   std::to_string(kMaxCacheRows) + "], not " +
                                   std::to_string(o.rows));
  }
  if (o.staleness < 1 || o.staleness > kMaxCacheStaleness) {
    return Status::InvalidArgument("row cache: staleness must be in [1, " +
                                   std::to_string(kMaxCacheStaleness) + "] clocks, not " +
                                   std::to_string(o.staleness));
  }
  if (o.consistency_staleness == 0) {
    return Status::InvalidArgument(
        "row cache: refused under bulk-synchronous consistency, which promises that every pull "
        "sees every earlier push; use asynchronous or bounded-staleness consistency");
  }
  if (o.admit_count == 0) return Status::InvalidArgument("row cache: admit_count must be >= 1");
  return Status::OK();
}

Result<std::unique_ptr<CachingStore>> CreateCachingStore(ParamStore* inner,
                                                         const RowCacheOptions& o) {
  if (inner == nullptr) return Status::InvalidArgument("row cache: no inner store");
  TESSERA_RETURN_IF_ERROR(ValidateRowCacheOptions(o));
  return std::unique_ptr<CachingStore>(new CachingStoreImpl(inner, o));
}

}  // namespace tessera::worker
