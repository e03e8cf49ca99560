#include "worker/data_source.h"

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
  if (spec.kind == "criteo" || spec.kind == "libsvm" || spec.kind == "movielens") {
    if (spec.path.empty()) return Status::InvalidArgument("data spec '" + s + "' needs a path");
    return spec;
  }
  return Status::InvalidArgument("unknown data spec '" + s +
                                 "' (want synthetic, criteo:PATH, libsvm:PATH, movielens:DIR)");
}

Result<std::unique_ptr<DataReader>> Open(const DataSourceOptions& o, bool train) {
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
  return OpenMovieLens(spec.path, shard);
}

}  // namespace

Result<std::unique_ptr<DataReader>> OpenTrainData(const DataSourceOptions& o) {
  TESSERA_ASSIGN_OR_RETURN(auto r, Open(o, true));
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

bool HasOracle(const DataSourceOptions& o) { return o.spec == "synthetic"; }

}  // namespace tessera::worker
