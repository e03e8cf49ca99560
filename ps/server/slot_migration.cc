#include "ps/server/slot_migration_internal.h"

namespace tessera::internal {

bool SlotMigration::CopyingIn(const ClusterMapState* map, uint32_t slot) {
  return map != nullptr && ((!map->importing.empty() && map->importing[slot]) ||
                            (!map->filling.empty() && map->filling[slot]));
}

void SlotMigration::MarkSlotsFilled(const std::vector<uint32_t>& slots) {
  for (uint32_t s : slots) slots_filled_[s] = true;
}

void SlotMigration::GrowDense(uint32_t parts) {
  if (dense_filled_.size() < parts) dense_filled_.resize(parts, false);
}

void SlotMigration::MarkDenseFilled(const std::vector<uint32_t>& parts) {
  for (uint32_t part : parts) dense_filled_[part] = true;
}

bool SlotMigration::ForgetSettled(const ClusterMapState* map) {
  bool cleared = false;
  for (uint32_t slot = 0; slot < kNumSlots; ++slot) {
    if (slots_filled_[slot] && !CopyingIn(map, slot)) {
      slots_filled_[slot] = false;
      cleared = true;
    }
  }
  for (uint32_t part = 0; part < dense_filled_.size(); ++part) {
    if (dense_filled_[part] &&
        (map == nullptr || part >= map->dense_filling.size() || !map->dense_filling[part])) {
      dense_filled_[part] = false;
      cleared = true;
    }
  }
  return cleared;
}

std::string SlotMigration::EncodeSlots() const {
  std::string bits(kNumSlots, '0');
  for (uint32_t s = 0; s < kNumSlots; ++s) bits[s] = slots_filled_[s] ? '1' : '0';
  return bits;
}

std::string SlotMigration::EncodeDense() const {
  std::string dense(dense_filled_.size(), '0');
  for (size_t part = 0; part < dense_filled_.size(); ++part) {
    dense[part] = dense_filled_[part] ? '1' : '0';
  }
  return dense;
}

Status SlotMigration::Decode(const std::optional<std::string>& slots,
                             const std::optional<std::string>& dense) {
  if (slots) {
    if (slots->size() != kNumSlots) return Status::Corruption("reshard/filled of the wrong size");
    for (uint32_t s = 0; s < kNumSlots; ++s) slots_filled_[s] = (*slots)[s] == '1';
  }
  if (dense) {
    if (dense->size() > 65535) return Status::Corruption("reshard/dense_filled too long");
    dense_filled_.assign(dense->size(), false);
    for (size_t part = 0; part < dense->size(); ++part) dense_filled_[part] = (*dense)[part] == '1';
  }
  return Status::OK();
}

bool SlotMigration::Park(const std::shared_ptr<Pending>& p, bool readmitting) {
  if (parked_.size() >= kMaxParked && !readmitting) return false;
  parked_.push_back(p);
  ++parked_total_;
  return true;
}

std::vector<std::shared_ptr<Pending>> SlotMigration::TakeParked() {
  std::vector<std::shared_ptr<Pending>> parked;
  parked.swap(parked_);
  return parked;
}

std::vector<std::shared_ptr<Pending>> SlotMigration::TakeExpired(
    std::chrono::steady_clock::time_point now) {
  std::vector<std::shared_ptr<Pending>> keep, expired;
  for (auto& p : parked_) {
    (now - p->received < kHoldLimit ? keep : expired).push_back(std::move(p));
  }
  parked_.swap(keep);
  return expired;
}

void SlotMigration::WaitExport(uint64_t version, std::function<void()> run) {
  exports_.push_back(WaitingExport{version, std::move(run)});
}

void SlotMigration::RunExports(const std::function<bool(uint64_t)>& older_waits) {
  while (!exports_.empty() && !older_waits(exports_.front().version)) {
    WaitingExport e = std::move(exports_.front());
    exports_.pop_front();
    e.run();
  }
}

}  // namespace tessera::internal
