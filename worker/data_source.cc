#include "worker/data_source.h"

#include <algorithm>
#include <vector>

namespace tessera::worker {
namespace {

struct Spec {
  std::string kind, path;
};

Result<Spec> ParseSpec(const std::string& s) {
  Spec spec;
  const size_t colon = s.find(':');
  spec.kind = s.substr(0, colon);
  if (colon != std::string::npos) spec.path = s.substr(colon + 1);
  if (spec.kind == "synthetic") return spec;
  if (spec.kind == "criteo" || spec.kind == "libsvm" || spec.kind == "csv" ||
      spec.kind == "movielens") {
    if (spec.path.empty()) return Status::InvalidArgument("data spec '" + s + "' needs a path");
    return spec;
  }
  return Status::InvalidArgument("unknown data spec '" + s +
                                 "' (want synthetic, criteo:PATH, libsvm:PATH, csv:PATH, "
                                 "movielens:DIR)");
}

// The training part (train), or test part; `validation` (with train): the validation part of
// a source that splits it off itself (MovieLens, by time).
Result<std::unique_ptr<DataReader>> Open(const DataSourceOptions& o, bool train,
                                         bool validation = false) {
  TESSERA_ASSIGN_OR_RETURN(Spec spec, ParseSpec(o.spec));
  ShardOptions shard;
  shard.rank = train ? o.rank : 0;
  shard.world = train ? o.world : 1;
  shard.holdout_mod = o.holdout_mod;
  shard.part = train ? ShardOptions::Part::kTrain : ShardOptions::Part::kTest;
  if (spec.kind == "synthetic") {
    SyntheticOptions s = o.synthetic;
    s.rank = shard.rank;
    s.world = shard.world;
    s.stream = train ? 0 : 1;
    s.num_samples = train ? o.train_samples : o.test_samples;
    TESSERA_ASSIGN_OR_RETURN(auto r, SyntheticReader::Create(s));
    return std::unique_ptr<DataReader>(std::move(r));
  }
  if (spec.kind == "criteo") return OpenCriteo(spec.path, shard);
  if (spec.kind == "libsvm") return OpenLibsvm(spec.path, shard, o.libsvm);
  if (spec.kind == "csv") {
    if (o.schema.empty()) {
      return Status::InvalidArgument("data spec '" + o.spec +
                                     "' needs a schema (--schema='label=COL;categorical=...')");
    }
    CsvOptions csv;
    TESSERA_ASSIGN_OR_RETURN(csv.schema, ParseCsvSchema(o.schema));
    csv.skip_bad_lines = o.skip_bad_lines;
    csv.skipped = o.skipped_lines;
    return OpenCsv(spec.path, shard, csv);
  }
  // MovieLens splits by time: its validation part is the latest tenth (1 / validation_mod) of
  // the training part, as the test part is the latest tenth of all.
  MovieLensOptions ml;
  if (o.validation_mod > 1 && shard.part == ShardOptions::Part::kTrain) {
    ml.validation_fraction = 1.0 / o.validation_mod;
    ml.validation = validation;
  }
  return OpenMovieLens(spec.path, shard, ml);
}

// Files hold out training sample g (its index in the whole training part) for validation iff
// g % mod == mod - 1. Every reader deals the part round-robin, so sample j of rank r's shard is
// sample j * world + r of the part.
bool IsValidationSample(uint64_t g, uint32_t mod) { return mod > 1 && g % mod == mod - 1; }
// Sources whose validation part is every validation_mod-th sample (synthetic data has a stream
// of its own, MovieLens a time range).
bool FileValidation(const DataSourceOptions& o) {
  return o.validation_mod > 1 && o.spec != "synthetic" && o.spec.rfind("movielens:", 0) != 0;
}

}  // namespace

Result<std::unique_ptr<DataReader>> OpenTrainData(const DataSourceOptions& o) {
  if (o.validation_mod == 1) return Status::InvalidArgument("validation_mod 1 would hold out all");
  TESSERA_ASSIGN_OR_RETURN(auto r, Open(o, true));
  if (FileValidation(o)) {
    const uint64_t rank = o.rank, world = std::max<uint32_t>(o.world, 1);
    const uint32_t mod = o.validation_mod;
    r = FilterByIndex(std::move(r), [rank, world, mod](uint64_t j) {
      return !IsValidationSample(j * world + rank, mod);
    });
  }
  if (o.shuffle_buffer > 0) {
    r = std::make_unique<ShuffleReader>(std::move(r), o.shuffle_buffer,
                                        o.shuffle_seed * 1000003 + o.rank);
  }
  if (o.epochs != 1) r = std::make_unique<EpochReader>(std::move(r), o.epochs);
  return r;
}

Result<std::unique_ptr<DataReader>> OpenTestData(const DataSourceOptions& o) {
  return Open(o, false);
}

Result<std::unique_ptr<DataReader>> OpenValidationData(const DataSourceOptions& o) {
  if (o.validation_mod == 0 || o.validation_mod == 1) {
    return Status::InvalidArgument("no validation part (validation_mod " +
                                   std::to_string(o.validation_mod) + ")");
  }
  DataSourceOptions whole = o;
  whole.rank = 0;
  whole.world = 1;
  if (o.spec == "synthetic") {
    SyntheticOptions s = o.synthetic;
    s.rank = 0;
    s.world = 1;
    s.stream = 2;
    s.num_samples = o.validation_samples;
    TESSERA_ASSIGN_OR_RETURN(auto r, SyntheticReader::Create(s));
    return std::unique_ptr<DataReader>(std::move(r));
  }
  if (!FileValidation(o)) return Open(whole, true, /*validation=*/true);
  TESSERA_ASSIGN_OR_RETURN(auto r, Open(whole, true));
  const uint32_t mod = o.validation_mod;
  return FilterByIndex(std::move(r), [mod](uint64_t g) { return IsValidationSample(g, mod); });
}

Result<uint64_t> SmallestTrainShard(const DataSourceOptions& o) {
  const uint64_t world = std::max<uint32_t>(o.world, 1);
  uint64_t part = o.train_samples;
  if (o.spec != "synthetic") {
    DataSourceOptions whole = o;
    whole.rank = 0;
    whole.world = 1;
    TESSERA_ASSIGN_OR_RETURN(auto r, Open(whole, true));
    Batch b;
    part = 0;
    while (true) {
      b.Clear(r->schema());
      TESSERA_ASSIGN_OR_RETURN(uint32_t n, r->Read(1u << 14, &b));
      if (n == 0) break;
      part += n;
    }
  }
  if (!FileValidation(o)) return part / world;  // round-robin: the last rank has the fewest
  std::vector<uint64_t> shard(world, 0);
  for (uint64_t g = 0; g < part; ++g) {
    if (!IsValidationSample(g, o.validation_mod)) ++shard[g % world];
  }
  return *std::min_element(shard.begin(), shard.end());
}

bool HasOracle(const DataSourceOptions& o) { return o.spec == "synthetic"; }

}  // namespace tessera::worker
