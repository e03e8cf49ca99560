// Deterministic initial values: a pure function of (seed, key, element index).
#pragma once

#include <cstdint>

#include "ps/table_spec.h"

namespace tessera {

/// Writes the initial values of elements [first, first + n) of row `key` into out[0..n).
/// Dense tensors use key 0 and the element's global index. Thread-safe (pure function).
void InitializeValues(const InitializerSpec& spec, uint64_t key, uint64_t first, uint64_t n,
                      float* out);

}  // namespace tessera
