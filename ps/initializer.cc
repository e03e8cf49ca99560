#include "ps/initializer.h"

#include <cmath>
#include <numbers>

#include "ps/routing.h"

namespace tessera {
namespace {
// A uniform double in (0, 1) from 53 bits of a mixed hash.
inline double Unit(uint64_t h) { return (static_cast<double>(h >> 11) + 0.5) * 0x1.0p-53; }
inline uint64_t ElementHash(uint64_t seed, uint64_t key, uint64_t index, uint64_t stream) {
  return Mix64(Mix64(seed ^ 0x9e3779b97f4a7c15ULL) ^ Mix64(key + 0x632be59bd9b4e019ULL) ^
               (index * 0xd6e8feb86659fd93ULL + stream));
}
}  // namespace

void InitializeValues(const InitializerSpec& spec, uint64_t key, uint64_t first, uint64_t n,
                      float* out) {
  switch (spec.kind) {
    case InitializerKind::kZeros:
      for (uint64_t i = 0; i < n; ++i) out[i] = 0.0f;
      return;
    case InitializerKind::kConstant:
      for (uint64_t i = 0; i < n; ++i) out[i] = spec.a;
      return;
    case InitializerKind::kUniform:
      for (uint64_t i = 0; i < n; ++i) {
        double u = Unit(ElementHash(spec.seed, key, first + i, 1));
        out[i] = static_cast<float>(spec.a + (double{spec.b} - spec.a) * u);
      }
      return;
    case InitializerKind::kNormal:
      for (uint64_t i = 0; i < n; ++i) {
        double u1 = Unit(ElementHash(spec.seed, key, first + i, 2));
        double u2 = Unit(ElementHash(spec.seed, key, first + i, 3));
        double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
        out[i] = static_cast<float>(spec.a + spec.b * z);
      }
      return;
  }
  for (uint64_t i = 0; i < n; ++i) out[i] = 0.0f;
}

}  // namespace tessera
