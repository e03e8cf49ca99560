// Server-side optimizers over (value, state, gradient) rows.
#pragma once

#include <cstdint>
#include <memory>

#include "ps/table_spec.h"

namespace tessera {

/// Applies one table's update rule. A row is `dim` values plus StateFloats(dim) floats of
/// optimizer state laid out as planes (plane p of element j at state[p*dim + j]; row-wise
/// state at state[0]). Immutable after creation: thread-safe.
class Optimizer {
 public:
  virtual ~Optimizer() = default;

  /// Floats of optimizer state per row of `dim` values.
  virtual uint32_t StateFloats(uint32_t dim) const = 0;
  /// Writes the initial state of a row.
  virtual void InitState(float* state, uint32_t dim) const;
  /// Applies gradients to elements [begin, end) of a row of `dim` values: grad[k] is the
  /// gradient of element begin + k. `step` is the row's update count including this one (>= 1).
  /// The step size is learning_rate * lr_scale (a schedule's factor for this push; FTRL ignores
  /// it). With spec().l2 > 0, every optimizer but FTRL (whose l2 is its own proximal term) adds
  /// l2 * value to each element's gradient first: L2 regularization of the rows a push updates
  /// (lazy: a row no push touches is not decayed).
  virtual void Apply(float* value, float* state, const float* grad, uint32_t dim, uint32_t begin,
                     uint32_t end, uint64_t step, float lr_scale) const = 0;
  /// FTRL keeps the value as a function of its state; others return false.
  virtual bool ValueFromStateOnly() const { return false; }

  const OptimizerSpec& spec() const { return spec_; }

  /// The optimizer for a spec (validated by ValidateTableSpec).
  static std::unique_ptr<Optimizer> Make(const OptimizerSpec& spec);

 protected:
  explicit Optimizer(const OptimizerSpec& spec) : spec_(spec) {}
  OptimizerSpec spec_;
};

}  // namespace tessera
