#include "worker/synthetic_data.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <numbers>
#include <utility>

#include "ps/feature_keys.h"
#include "ps/mutex.h"
#include "ps/routing.h"
#include "worker/synthetic_data_internal.h"

namespace tessera::worker {
namespace {

using internal::Hash3;
using internal::Next;
using internal::Normal;
using internal::SyntheticTables;
using internal::Unit;

constexpr uint32_t kAbsent = ~0u;  // a Draw's `where.lo` for a missing field

// Criteo's Kaggle cardinalities.
constexpr uint64_t kCriteoCard[26] = {
    1460, 583,   10131227, 2202608, 305,  24,   12517, 633,     3,  93145, 5683,   8351593, 3194,
    27,   14992, 5461306,  10,      5652, 2173, 4,     7046547, 18, 15,    286181, 105,     142572};
// Fraction of missing values per field (Criteo has fields missing up to ~45% of the time).
constexpr double kCriteoMissing[26] = {0.0,  0.0,  0.03, 0.03, 0.0, 0.1,  0.0,  0.0, 0.0,
                                       0.03, 0.0,  0.03, 0.0,  0.0, 0.0,  0.03, 0.0, 0.0,
                                       0.44, 0.44, 0.03, 0.0,  0.0, 0.03, 0.44, 0.03};

}  // namespace

std::vector<uint64_t> CriteoLikeCardinalities(uint64_t cap) {
  std::vector<uint64_t> c(std::begin(kCriteoCard), std::end(kCriteoCard));
  for (auto& x : c) x = std::min(x, std::max<uint64_t>(cap, 1));
  return c;
}

namespace {

// What the fast generator's tables depend on: the options that define the planted model and
// the ranks tabulated.
struct TablesKey {
  uint64_t seed;
  std::vector<uint64_t> cardinalities;
  double zipf_exponent, interaction_std, bias_std, tail_rank;
  uint32_t planted_dim, table_ranks;
  bool operator==(const TablesKey&) const = default;
};

// The tables of live readers, found by their planted model, so that the readers of a job
// (training, test and validation streams, one per rank) and of a test share one copy and
// build it once. The last tables built stay held after their readers are gone: a test that
// creates and drops readers one after the other builds them once too. Immutable tables behind
// shared_ptrs; one process-wide instance (the sharing is its purpose; it changes no result).
// Thread-safe: Create may run on several threads at once.
class TablesCache {
 public:
  template <typename Build>
  std::shared_ptr<const SyntheticTables> Get(const TablesKey& key, Build&& build) {
    MutexLock l(mu_);
    std::erase_if(entries_, [](const Entry& e) { return e.tables.expired(); });
    for (const Entry& e : entries_) {
      if (e.key == key) {
        if (auto t = e.tables.lock()) return t;
      }
    }
    // Built under the lock: readers of one model created at once build it once.
    auto t = std::make_shared<const SyntheticTables>(build());
    entries_.push_back({key, t});
    last_ = t;
    return t;
  }

 private:
  struct Entry {
    TablesKey key;
    std::weak_ptr<const SyntheticTables> tables;
  };
  Mutex mu_;
  std::vector<Entry> entries_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<const SyntheticTables> last_ ABSL_GUARDED_BY(mu_);
};

TablesCache& Cache() {
  static TablesCache* const cache = new TablesCache;  // never destroyed: readers may outlive main
  return *cache;
}

}  // namespace

Result<std::unique_ptr<SyntheticReader>> SyntheticReader::Create(const SyntheticOptions& o) {
  if (o.world == 0 || o.rank >= o.world) return Status::InvalidArgument("rank not in [0, world)");
  if (o.cardinalities.empty() || o.cardinalities.size() > kMaxFields) {
    return Status::InvalidArgument("cardinalities: need 1.." + std::to_string(kMaxFields));
  }
  for (uint64_t c : o.cardinalities) {
    if (c == 0) return Status::InvalidArgument("cardinality 0");
  }
  if (!(o.zipf_exponent > 0) || o.planted_dim == 0 || o.planted_dim > 8) {
    return Status::InvalidArgument("zipf_exponent must be > 0 and planted_dim in [1, 8]");
  }
  if (o.table_ranks == 0 || o.table_ranks > (1u << 20)) {
    return Status::InvalidArgument("table_ranks must be in [1, 2^20], got " +
                                   std::to_string(o.table_ranks));
  }
  std::unique_ptr<SyntheticReader> r(new SyntheticReader(o));
  if (!o.reference_generator) {
    const TablesKey key{o.seed,     o.cardinalities, o.zipf_exponent, o.interaction_std,
                        o.bias_std, o.tail_rank,     o.planted_dim,   o.table_ranks};
    const internal::PlantedModel model = r->Model();
    r->tables_ = Cache().Get(key, [&] {
      return SyntheticTables::Build(model, o.cardinalities, o.zipf_exponent, o.table_ranks,
                                    kMaxSyntheticTableBytes);
    });
  }
  return r;
}

SyntheticReader::SyntheticReader(const SyntheticOptions& o) : options_(o) {
  const uint32_t nf = static_cast<uint32_t>(o.cardinalities.size());
  schema_.num_dense = o.num_dense;
  schema_.num_fields = nf;
  for (uint32_t f = 0; f < nf; ++f) {
    zipf_.push_back(internal::MakeZipf(o.cardinalities[f], o.zipf_exponent, 1));
    missing_.push_back(f < 26 ? kCriteoMissing[f] : 0.0);
  }
  // Interactions: P pairs of k-wide dots of N(0, sigma_v^2) entries have variance P k sigma_v^4.
  const double pairs = nf * (nf - 1) / 2.0;
  sigma_v_ = pairs > 0
                 ? std::pow(o.interaction_std * o.interaction_std / (pairs * o.planted_dim), 0.25)
                 : 0.0;
  sigma_b_ = o.bias_std / std::sqrt(static_cast<double>(nf));
  for (uint32_t j = 0; j < o.num_dense; ++j) {
    dense_w_.push_back(Normal(Hash3(o.seed, 1000 + j, 1), Hash3(o.seed, 1000 + j, 2)) *
                       o.dense_std / std::sqrt(static_cast<double>(o.num_dense)));
  }
}

SyntheticReader::~SyntheticReader() = default;

internal::PlantedModel SyntheticReader::Model() const {
  return {options_.seed, options_.tail_rank, sigma_b_, sigma_v_, options_.planted_dim};
}

uint64_t SyntheticReader::KeyOf(uint32_t field, uint64_t rank) {
  return internal::KeyOfRank(field, rank);
}

void SyntheticReader::Planted(uint32_t field, uint64_t rank, double* bias, double* vec) const {
  if (tables_ != nullptr && rank <= tables_->fields[field].head) {
    const uint32_t k = tables_->dim;
    const uint64_t* r = tables_->Record(tables_->fields[field], static_cast<uint32_t>(rank - 1));
    *bias = std::bit_cast<double>(r[SyntheticTables::kBias]);
    for (uint32_t d = 0; d < k; ++d)
      vec[d] = std::bit_cast<double>(r[SyntheticTables::kVector + d]);
    return;
  }
  internal::ComputePlanted(Model(), field, rank, bias, vec);
}

uint32_t SyntheticReader::tabulated_ranks() const { return tables_ ? tables_->head : 0; }
size_t SyntheticReader::table_bytes() const { return tables_ ? tables_->bytes : 0; }

Status SyntheticReader::Seek(uint64_t position) {
  if (options_.num_samples != 0) {
    const uint64_t mine =
        (options_.num_samples + options_.world - 1 - options_.rank) / options_.world;
    if (position > mine) return Status::InvalidArgument("seek past the end of the stream");
  }
  position_ = position;
  return Status::OK();
}

void SyntheticReader::Generate(uint64_t index, Batch* batch) const {
  if (tables_ == nullptr) {
    GenerateReference(index, batch);
  } else {
    GenerateFast(index, batch);
  }
}

// The slow exact reference: per sample, 13 Box-Muller normals, rejection-inversion for every
// field, every chosen id's planted values hashed, and the 325 pairwise dots summed.
void SyntheticReader::GenerateReference(uint64_t index, Batch* batch) const {
  const SyntheticOptions& o = options_;
  const uint32_t nf = schema_.num_fields, k = o.planted_dim;
  const internal::PlantedModel model = Model();
  uint64_t rng = Hash3(o.seed, o.stream + 0x51ed270b, index);
  double logit = o.offset;
  for (uint32_t j = 0; j < o.num_dense; ++j) {
    // Heavy-tailed non-negative features, like log(1 + count).
    const double x = std::log1p(std::exp(1.5 * Normal(Next(&rng), Next(&rng))));
    batch->dense.push_back(static_cast<float>(x));
    logit += dense_w_[j] * (x - 1.0);
  }
  // Planted vectors of the chosen ids; absent fields have none.
  double vecs[kMaxFields][8];
  bool present[kMaxFields];
  const uint32_t kk = std::min<uint32_t>(k, 8);
  for (uint32_t f = 0; f < nf; ++f) {
    present[f] = Unit(Next(&rng)) >= missing_[f];
    const uint64_t rank = internal::SampleZipf(zipf_[f], &rng);
    if (present[f]) {
      batch->keys.push_back(KeyOf(f, rank));
      if (!batch->weights.empty()) batch->weights.push_back(1.0f);
      double bias;
      internal::ComputePlanted(model, f, rank, &bias, vecs[f]);
      logit += bias;
    }
    batch->offsets.push_back(static_cast<uint32_t>(batch->keys.size()));
  }
  for (uint32_t f = 0; f < nf; ++f) {
    if (!present[f]) continue;
    for (uint32_t g = f + 1; g < nf; ++g) {
      if (!present[g]) continue;
      double dot = 0;
      for (uint32_t d = 0; d < kk; ++d) dot += vecs[f][d] * vecs[g][d];
      logit += dot;
    }
  }
  const double p = 1.0 / (1.0 + std::exp(-logit));
  batch->labels.push_back(Unit(Next(&rng)) < p ? 1.0f : 0.0f);
  batch->true_probs.push_back(static_cast<float>(p));
  ++batch->size;
}

// The same distribution from tables: the dense features by their quantile table, each present
// field's rank from its CDF table (a rank beyond the table by rejection-inversion over the
// tail), the planted values of tabulated ranks looked up, and the pairwise dots as
// (|sum v|^2 - sum |v|^2) / 2. A sample stream of its own (another seed salt).
void SyntheticReader::GenerateFast(uint64_t index, Batch* batch) const {
  const SyntheticOptions& o = options_;
  const SyntheticTables& t = *tables_;
  const uint32_t nf = schema_.num_fields, k = t.dim;
  uint64_t rng = Hash3(o.seed, o.stream + 0x6a09e667f3bcc909ULL, index);
  double logit = o.offset;
  const size_t dense_at = batch->dense.size();
  batch->dense.resize(dense_at + o.num_dense);
  float* dense = batch->dense.data() + dense_at;
  for (uint32_t j = 0; j < o.num_dense; ++j) {
    const double x = t.dense.Quantile(Next(&rng));
    dense[j] = static_cast<float>(x);
    logit += dense_w_[j] * (x - 1.0);
  }
  // Room for a key per field; trimmed to the present ones below.
  const size_t keys_at = batch->keys.size(), offsets_at = batch->offsets.size();
  batch->keys.resize(keys_at + nf);
  batch->offsets.resize(offsets_at + nf);
  uint64_t* keys = batch->keys.data() + keys_at;
  uint32_t* offsets = batch->offsets.data() + offsets_at;
  // Two passes over the fields: the draws first, prefetching each field's guessed record, so
  // that the cold lines of a sample's rare ranks load at once rather than one after another.
  struct Draw {
    uint64_t r;
    SyntheticTables::Guess where;
  };
  Draw draws[kMaxFields];
  for (uint32_t f = 0; f < nf; ++f) {
    if (missing_[f] > 0 && Unit(Next(&rng)) < missing_[f]) {
      draws[f].where.lo = kAbsent;
      continue;
    }
    const SyntheticTables::Field& field = t.fields[f];
    draws[f].r = Next(&rng);
    draws[f].where = t.Locate(field, draws[f].r);
    if (draws[f].where.guess < field.head)
      __builtin_prefetch(t.Record(field, draws[f].where.guess));
  }
  uint32_t present = 0;
  double sum[8] = {0, 0, 0, 0, 0, 0, 0, 0}, squares = 0;
  uint64_t tail[10];  // a tail rank's record
  for (uint32_t f = 0; f < nf; ++f) {
    if (draws[f].where.lo == kAbsent) {
      offsets[f] = static_cast<uint32_t>(keys_at + present);
      continue;
    }
    const SyntheticTables::Field& field = t.fields[f];
    const uint32_t i = t.Resolve(field, draws[f].r, draws[f].where);
    const uint64_t* record;
    if (i < field.head) {
      record = t.Record(field, i);
    } else {
      const uint64_t rank = internal::SampleZipf(field.tail, &rng);
      double planted[9];
      internal::ComputePlanted(Model(), f, rank, &planted[0], &planted[1]);
      tail[0] = KeyOf(f, rank);
      for (uint32_t w = 0; w <= k; ++w) tail[1 + w] = std::bit_cast<uint64_t>(planted[w]);
      record = tail;
    }
    keys[present++] = record[SyntheticTables::kKey];
    offsets[f] = static_cast<uint32_t>(keys_at + present);
    logit += std::bit_cast<double>(record[SyntheticTables::kBias]);
    for (uint32_t d = 0; d < k; ++d) {
      const double v = std::bit_cast<double>(record[SyntheticTables::kVector + d]);
      sum[d] += v;
      squares += v * v;
    }
  }
  batch->keys.resize(keys_at + present);
  if (!batch->weights.empty()) batch->weights.resize(batch->weights.size() + present, 1.0f);
  double norm = 0;
  for (uint32_t d = 0; d < k; ++d) norm += sum[d] * sum[d];
  logit += 0.5 * (norm - squares);
  const double p = 1.0 / (1.0 + std::exp(-logit));
  batch->labels.push_back(Unit(Next(&rng)) < p ? 1.0f : 0.0f);
  batch->true_probs.push_back(static_cast<float>(p));
  ++batch->size;
}

Result<uint32_t> SyntheticReader::Read(uint32_t max_samples, Batch* batch) {
  const SyntheticOptions& o = options_;
  if (batch->size > 0 && batch->true_probs.size() != batch->size) {
    return Status::InvalidArgument("batch mixes generated and read samples");
  }
  uint32_t n = 0;
  while (n < max_samples) {
    const uint64_t index = o.rank + position_ * o.world;
    if (o.num_samples != 0 && index >= o.num_samples) break;
    Generate(index, batch);
    ++position_;
    ++n;
  }
  return n;
}

}  // namespace tessera::worker
