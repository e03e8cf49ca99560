// Where the model's parameters live: the Tessera cluster, or (for comparison) local memory.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "ps/client/client.h"
#include "ps/status.h"
#include "ps/table_spec.h"

namespace tessera::worker {

/// The completion of a ParamStore call; Wait() returns its result (once or more: the result is
/// kept). Default-constructed: already OK. Copyable; copies share the result.
class Pending {
 public:
  Pending() = default;
  explicit Pending(std::function<Status()> wait);
  static Pending Done(Status s);
  Status Wait();

 private:
  struct State;
  std::shared_ptr<State> state_;
};

/// Parameter tables as the training loop sees them. Implementations are thread-safe.
/// Semantics are the client's (ps/client/client.h): pulls fill `out` in key order, pushes send
/// gradients that the table's optimizer applies, Clock/SetClock/Barrier/Meta coordinate workers.
class ParamStore {
 public:
  virtual ~ParamStore() = default;
  /// Creates (or opens an equal) table; returns its index for the calls below.
  virtual Result<uint32_t> AddTable(const TableSpec& spec) = 0;
  virtual Pending Pull(uint32_t table, std::span<const uint64_t> keys, float* out) = 0;
  virtual Pending Push(uint32_t table, std::span<const uint64_t> keys,
                       std::span<const float> grads) = 0;
  virtual Pending DensePull(uint32_t table, uint64_t offset, uint64_t length, float* out) = 0;
  virtual Pending DensePush(uint32_t table, uint64_t offset, std::span<const float> grads) = 0;
  virtual Pending Clock() = 0;
  virtual int64_t clock() const = 0;
  virtual Status SetClock(int64_t clock) = 0;
  virtual Status Barrier(const std::string& name) = 0;
  virtual Status PutMeta(const std::string& name, std::string_view value) = 0;
  virtual Result<std::optional<std::string>> GetMeta(const std::string& name) = 0;
  /// The learning-rate factor of pushes issued from now on (Client::SetLearningRateScale).
  virtual Status SetLearningRateScale(float scale) = 0;
};

/// A store that passes every call to `inner` (borrowed; must outlive it): the base of stores
/// that change a few calls and leave the rest to the store they wrap.
class ForwardingStore : public ParamStore {
 public:
  explicit ForwardingStore(ParamStore* inner) : inner_(inner) {}
  Result<uint32_t> AddTable(const TableSpec& spec) override { return inner_->AddTable(spec); }
  Pending Pull(uint32_t table, std::span<const uint64_t> keys, float* out) override {
    return inner_->Pull(table, keys, out);
  }
  Pending Push(uint32_t table, std::span<const uint64_t> keys,
               std::span<const float> grads) override {
    return inner_->Push(table, keys, grads);
  }
  Pending DensePull(uint32_t table, uint64_t offset, uint64_t length, float* out) override {
    return inner_->DensePull(table, offset, length, out);
  }
  Pending DensePush(uint32_t table, uint64_t offset, std::span<const float> grads) override {
    return inner_->DensePush(table, offset, grads);
  }
  Pending Clock() override { return inner_->Clock(); }
  int64_t clock() const override { return inner_->clock(); }
  Status SetClock(int64_t clock) override { return inner_->SetClock(clock); }
  Status Barrier(const std::string& name) override { return inner_->Barrier(name); }
  Status PutMeta(const std::string& name, std::string_view value) override {
    return inner_->PutMeta(name, value);
  }
  Result<std::optional<std::string>> GetMeta(const std::string& name) override {
    return inner_->GetMeta(name);
  }
  Status SetLearningRateScale(float scale) override { return inner_->SetLearningRateScale(scale); }

 protected:
  ParamStore* const inner_;
};

/// A store on a Tessera cluster through `client` (borrowed; must outlive the store).
std::unique_ptr<ParamStore> CreateClusterStore(Client* client);

/// A store in this process's memory with the servers' optimizers and initializers (the
/// in-process baseline of benchmarks). Clock and Barrier are local no-ops.
std::unique_ptr<ParamStore> CreateLocalStore();

}  // namespace tessera::worker
