#include "worker/param_store.h"

#include <map>
#include <unordered_map>
#include <vector>

#include "ps/initializer.h"
#include "ps/mutex.h"
#include "ps/optimizer.h"

namespace tessera::worker {

struct Pending::State {
  Mutex mu;
  std::function<Status()> wait ABSL_GUARDED_BY(mu);  // empty once run
  Status result ABSL_GUARDED_BY(mu);
};

Pending::Pending(std::function<Status()> wait) : state_(std::make_shared<State>()) {
  state_->wait = std::move(wait);
}

Pending Pending::Done(Status s) {
  Pending p;
  p.state_ = std::make_shared<State>();
  MutexLock lock(p.state_->mu);  // not shared yet: taken for the analysis
  p.state_->result = std::move(s);
  return p;
}

Status Pending::Wait() {
  if (state_ == nullptr) return Status::OK();
  MutexLock lock(state_->mu);
  if (state_->wait) {
    state_->result = state_->wait();
    state_->wait = nullptr;
  }
  return state_->result;
}

namespace {

class ClusterStore final : public ParamStore {
 public:
  explicit ClusterStore(Client* client) : client_(client) {}

  Result<uint32_t> AddTable(const TableSpec& spec) override {
    TESSERA_ASSIGN_OR_RETURN(Table t, client_->CreateTable(spec));
    MutexLock lock(mu_);
    tables_.push_back(t);
    return static_cast<uint32_t>(tables_.size() - 1);
  }
  Pending Pull(uint32_t table, std::span<const uint64_t> keys, float* out) override {
    return Wrap(client_->Pull(Get(table), keys, out));
  }
  Pending Push(uint32_t table, std::span<const uint64_t> keys,
               std::span<const float> grads) override {
    return Wrap(client_->Push(Get(table), keys, grads));
  }
  Pending DensePull(uint32_t table, uint64_t offset, uint64_t length, float* out) override {
    return Wrap(client_->DensePull(Get(table), offset, length, out));
  }
  Pending DensePush(uint32_t table, uint64_t offset, std::span<const float> grads) override {
    return Wrap(client_->DensePush(Get(table), offset, grads));
  }
  Pending Clock() override { return Wrap(client_->Clock()); }
  int64_t clock() const override { return client_->clock(); }
  Status SetClock(int64_t clock) override { return client_->Wait(client_->SetClock(clock)); }
  Status Barrier(const std::string& name) override { return client_->Barrier(name); }
  Status PutMeta(const std::string& name, std::string_view value) override {
    return client_->PutMeta(name, value);
  }
  Result<std::optional<std::string>> GetMeta(const std::string& name) override {
    return client_->GetMeta(name);
  }
  Status SetLearningRateScale(float scale) override {
    return client_->SetLearningRateScale(scale);
  }

 private:
  Table Get(uint32_t i) {
    MutexLock lock(mu_);
    return tables_.at(i);
  }
  Pending Wrap(Handle h) {
    Client* c = client_;
    return Pending([c, h] { return c->Wait(h); });
  }

  Client* client_;
  Mutex mu_;
  std::vector<Table> tables_ ABSL_GUARDED_BY(mu_);
};

class LocalStore final : public ParamStore {
 public:
  Result<uint32_t> AddTable(const TableSpec& spec) override {
    TESSERA_RETURN_IF_ERROR(ValidateTableSpec(spec));
    MutexLock lock(mu_);
    for (size_t i = 0; i < tables_.size(); ++i) {
      if (tables_[i]->spec.name == spec.name) {
        std::string diff = DescribeSpecDifference(tables_[i]->spec, spec);
        if (!diff.empty()) return Status::AlreadyExists("table " + spec.name + ": " + diff);
        return static_cast<uint32_t>(i);
      }
    }
    auto t = std::make_unique<LocalTable>();
    t->spec = spec;
    t->opt = Optimizer::Make(spec.optimizer);
    t->dim = spec.kind == TableKind::kSparse ? spec.dim : static_cast<uint32_t>(spec.length);
    t->state_floats = t->opt->StateFloats(t->dim);
    tables_.push_back(std::move(t));
    return static_cast<uint32_t>(tables_.size() - 1);
  }

  Pending Pull(uint32_t table, std::span<const uint64_t> keys, float* out) override {
    MutexLock lock(mu_);
    LocalTable* t = Find(table);
    if (t == nullptr) return BadTable(table);
    const uint32_t d = t->dim;
    for (size_t i = 0; i < keys.size(); ++i) {
      auto it = t->rows.find(keys[i]);
      if (it == t->rows.end()) {
        InitializeValues(t->spec.initializer, keys[i], 0, d, out + i * d);
      } else {
        std::copy(it->second.data.begin(), it->second.data.begin() + d, out + i * d);
      }
    }
    return Pending();
  }

  Pending Push(uint32_t table, std::span<const uint64_t> keys,
               std::span<const float> grads) override {
    MutexLock lock(mu_);
    LocalTable* t = Find(table);
    if (t == nullptr) return BadTable(table);
    const uint32_t d = t->dim;
    if (grads.size() != keys.size() * d) {
      return Pending::Done(Status::InvalidArgument("push: gradient size mismatch"));
    }
    for (size_t i = 0; i < keys.size(); ++i) Apply(t, keys[i], grads.data() + i * d);
    return Pending();
  }

  Pending DensePull(uint32_t table, uint64_t offset, uint64_t length, float* out) override {
    MutexLock lock(mu_);
    LocalTable* t = Find(table);
    if (t == nullptr) return BadTable(table);
    if (offset + length > t->dim) return Pending::Done(Status::InvalidArgument("dense range"));
    Row& r = RowOf(t, 0);
    std::copy(r.data.begin() + offset, r.data.begin() + offset + length, out);
    return Pending();
  }

  Pending DensePush(uint32_t table, uint64_t offset, std::span<const float> grads) override {
    MutexLock lock(mu_);
    LocalTable* t = Find(table);
    if (t == nullptr) return BadTable(table);
    if (offset + grads.size() > t->dim) {
      return Pending::Done(Status::InvalidArgument("dense range"));
    }
    Row& r = RowOf(t, 0);
    ++r.step;
    t->opt->Apply(r.data.data(), r.data.data() + t->dim, grads.data(), t->dim,
                  static_cast<uint32_t>(offset), static_cast<uint32_t>(offset + grads.size()),
                  r.step, lr_scale_);
    return Pending();
  }

  Pending Clock() override {
    MutexLock lock(mu_);
    ++clock_;
    return Pending();
  }
  int64_t clock() const override {
    MutexLock lock(mu_);
    return clock_;
  }
  Status SetClock(int64_t clock) override {
    MutexLock lock(mu_);
    clock_ = clock;
    return Status::OK();
  }
  Status Barrier(const std::string&) override { return Status::OK(); }
  Status PutMeta(const std::string& name, std::string_view value) override {
    MutexLock lock(mu_);
    meta_[name] = std::string(value);
    return Status::OK();
  }
  Result<std::optional<std::string>> GetMeta(const std::string& name) override {
    MutexLock lock(mu_);
    auto it = meta_.find(name);
    if (it == meta_.end()) return std::optional<std::string>();
    return std::optional<std::string>(it->second);
  }
  Status SetLearningRateScale(float scale) override {
    if (!(scale >= 0.0f && scale <= kMaxLrScale)) {
      return Status::InvalidArgument("learning-rate scale must be in [0, 1000]");
    }
    MutexLock lock(mu_);
    lr_scale_ = scale;
    return Status::OK();
  }

 private:
  struct Row {
    std::vector<float> data;  // dim values, then optimizer state
    uint64_t step = 0;
  };
  struct LocalTable {
    TableSpec spec;
    std::unique_ptr<Optimizer> opt;
    uint32_t dim = 0;
    uint32_t state_floats = 0;
    std::unordered_map<uint64_t, Row> rows;
  };

  LocalTable* Find(uint32_t i) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return i < tables_.size() ? tables_[i].get() : nullptr;
  }
  static Pending BadTable(uint32_t i) {
    return Pending::Done(Status::InvalidArgument("no table with index " + std::to_string(i)));
  }
  Row& RowOf(LocalTable* t, uint64_t key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto [it, inserted] = t->rows.try_emplace(key);
    if (inserted) {
      it->second.data.resize(size_t{t->dim} + t->state_floats);
      InitializeValues(t->spec.initializer, key, 0, t->dim, it->second.data.data());
      t->opt->InitState(it->second.data.data() + t->dim, t->dim);
    }
    return it->second;
  }
  void Apply(LocalTable* t, uint64_t key, const float* grad) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Row& r = RowOf(t, key);
    ++r.step;
    t->opt->Apply(r.data.data(), r.data.data() + t->dim, grad, t->dim, 0, t->dim, r.step,
                  lr_scale_);
  }

  mutable Mutex mu_;
  float lr_scale_ ABSL_GUARDED_BY(mu_) = 1.0f;
  std::vector<std::unique_ptr<LocalTable>> tables_ ABSL_GUARDED_BY(mu_);
  int64_t clock_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, std::string> meta_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<ParamStore> CreateClusterStore(Client* client) {
  return std::make_unique<ClusterStore>(client);
}

std::unique_ptr<ParamStore> CreateLocalStore() { return std::make_unique<LocalStore>(); }

}  // namespace tessera::worker
