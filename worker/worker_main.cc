// tessera-worker: trains the click model on a Tessera cluster and reports its test quality.
#include <gflags/gflags.h>
#include <glog/logging.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <memory>
#include <sstream>

#include "ps/cli.h"
#include "ps/client/client.h"
#include "ps/curve.h"
#include "ps/routing.h"
#include "worker/backend.h"
#include "worker/data_source.h"
#include "worker/local_ranks.h"
#include "worker/local_reducer.h"
#include "worker/param_store.h"
#include "worker/trainer.h"

DEFINE_string(servers, "", "Server endpoints in rank order: comma-separated, or @FILE");
DEFINE_string(curve_server_key_file, "",
              "File holding the servers' CurveZMQ public key (clusters started with "
              "--curve_secret_key_file)");
DEFINE_uint32(worker_id, 0, "This worker's rank among the job's workers");
DEFINE_uint32(num_workers, 1, "Workers (nodes) in the job");
DEFINE_uint32(local_ranks, 1,
              "Local ranks reduced inside this node before one push: CPU threads, or with "
              "--backend=cuda one GPU each (rank r on GPU r mod the GPU count; NCCL)");
DEFINE_string(data, "synthetic", "synthetic | criteo:PATH | libsvm:PATH | movielens:DIR");
DEFINE_uint64(train_samples, 2500000, "Synthetic: training samples (all workers together)");
DEFINE_uint64(test_samples, 100000, "Synthetic: test samples");
DEFINE_uint64(seed, 1, "Synthetic: seed of the planted model");
DEFINE_uint64(synthetic_max_cardinality, 20000, "Synthetic: cap of the Criteo cardinalities");
DEFINE_double(zipf, 1.2, "Synthetic: Zipf exponent of ids");
DEFINE_double(interaction_std, tessera::worker::SyntheticOptions{}.interaction_std,
              "Synthetic: standard deviation of the planted pairwise interactions' logit part");
DEFINE_double(bias_std, tessera::worker::SyntheticOptions{}.bias_std,
              "Synthetic: standard deviation of the planted per-id biases' logit part");
DEFINE_uint32(planted_dim, tessera::worker::SyntheticOptions{}.planted_dim,
              "Synthetic: width of the planted field vectors (1..8)");
DEFINE_uint32(epochs, 1, "Passes over the training data");
DEFINE_uint32(shuffle_buffer, 0, "Shuffle buffer in samples (0: file order)");
DEFINE_uint32(holdout_mod, 10, "Criteo/libSVM: every N-th line is a test line");
DEFINE_uint32(batch_size, 1024, "Samples per step per local rank");
DEFINE_uint64(max_steps, 0, "Stop after this many steps (0: when the data ends)");
DEFINE_bool(prefetch, true, "Pull the next batch while this one computes");
DEFINE_string(consistency, "async", "async | bsp | ssp");
DEFINE_int32(staleness, 2, "Bound of --consistency=ssp, in clocks");
DEFINE_int32(threads, 1, "CPU backend threads per local rank");
DEFINE_string(backend, "cpu", "cpu | cuda");
DEFINE_uint32(embedding_dim, 8, "Embedding width");
DEFINE_string(bottom_mlp, "64", "Bottom MLP hidden widths, comma-separated (may be empty)");
DEFINE_string(top_mlp, "64", "Top MLP hidden widths, comma-separated (may be empty)");
DEFINE_string(pooling, "sum", "Embedding bag pooling: sum | mean");
DEFINE_bool(deep, true, "Train the deep (DLRM) part");
DEFINE_bool(wide, true, "Train the wide part (FTRL)");
DEFINE_double(emb_lr, 0.05, "Embedding Adagrad learning rate");
DEFINE_double(dense_lr, 0.003, "MLP Adam learning rate");
DEFINE_double(wide_lr, 0.05, "Wide FTRL alpha");
DEFINE_double(emb_init_acc,
              tessera::worker::ModelConfig::DefaultEmbeddingOptimizer().initial_accumulator,
              "Embedding Adagrad initial accumulator");
DEFINE_string(job, "ctr", "Job name: table prefix and position records");
DEFINE_bool(resume, true, "Resume from the stored position of this worker");
DEFINE_bool(evaluate, true, "After training (and a barrier of all workers), worker 0 evaluates");
DEFINE_double(progress_interval_s, 5, "Seconds between progress lines");
DEFINE_int64(request_timeout_ms, 60000, "Client request timeout");
DEFINE_int64(retry_for_ms, 120000,
             "How long calls to a server that is down are retried (pushes apply exactly once) "
             "before the worker fails; 0: no retries");

namespace tw = tessera::worker;

namespace {

constexpr tessera::cli::ToolInfo kTool{
    .name = "tessera-worker",
    .usage = "usage: tessera-worker --servers=EPS [--worker_id=I --num_workers=N] [--data=SPEC]\n"
             "Trains a click model on a Tessera cluster and reports its test quality.",
    .flags_file = __FILE__};

int Fail(const tessera::Status& s) {
  std::fprintf(stderr, "tessera-worker %u: %s\n", FLAGS_worker_id, s.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  tessera::cli::ParseCommandLine(kTool, &argc, &argv);
  if (!tessera::cli::CheckOneOf(kTool, "backend", FLAGS_backend, {"cpu", "cuda"}) ||
      !tessera::cli::CheckOneOf(kTool, "pooling", FLAGS_pooling, {"sum", "mean"}) ||
      !tessera::cli::CheckOneOf(kTool, "consistency", FLAGS_consistency,
                                {"async", "bsp", "ssp"})) {
    return 2;
  }
  auto servers = tessera::ParseClusterList(FLAGS_servers);
  if (!servers.ok()) return tessera::cli::UsageError(kTool, "--servers: " + servers.status().ToString());
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;

  // The compute set-up is checked before anything connects: a node without the GPUs it was
  // asked for is refused at once.
  const uint32_t nl = std::max<uint32_t>(FLAGS_local_ranks, 1);
  int gpus = 0;
  if (FLAGS_backend == "cuda") {
    auto n = tw::CudaDeviceCount();
    if (!n.ok()) return Fail(n.status().WithContext("--backend=cuda"));
    gpus = *n;
  }
  const tw::ReducerKind reducer_kind = tw::ChooseReducer(FLAGS_backend, nl);
  auto group_or = tw::CreateReduceGroup(reducer_kind, nl);
  if (!group_or.ok()) {
    return Fail(group_or.status().WithContext("--backend=" + FLAGS_backend +
                                              " --local_ranks=" + std::to_string(nl)));
  }
  std::shared_ptr<tw::ReduceGroup> group = *group_or;
  std::printf("worker %u %s\n", FLAGS_worker_id, tw::DescribeReducer(reducer_kind, nl).c_str());
  std::fflush(stdout);

  int32_t staleness = -1;  // async
  if (FLAGS_consistency == "bsp") {
    staleness = 0;
  } else if (FLAGS_consistency == "ssp") {
    staleness = std::max(FLAGS_staleness, 1);
  }

  tessera::ClientOptions copt;
  copt.servers = *servers;
  copt.worker_id = FLAGS_worker_id;
  copt.consistency.num_workers = FLAGS_num_workers;
  copt.consistency.staleness = staleness;
  copt.request_timeout_ms = FLAGS_request_timeout_ms;
  copt.retry_for_ms = FLAGS_retry_for_ms;
  if (!FLAGS_curve_server_key_file.empty()) {
    auto key = tessera::ReadCurveKeyFile(FLAGS_curve_server_key_file);
    if (!key.ok()) return Fail(key.status());
    copt.curve_server_key = *key;
  }
  auto client = tessera::Client::Create(copt);
  if (!client.ok()) return Fail(client.status());
  auto store = tw::CreateClusterStore(client->get());

  tw::DataSourceOptions dopt;
  dopt.spec = FLAGS_data;
  dopt.world = FLAGS_num_workers * FLAGS_local_ranks;
  dopt.epochs = FLAGS_epochs;
  dopt.shuffle_buffer = FLAGS_shuffle_buffer;
  dopt.holdout_mod = FLAGS_holdout_mod;
  dopt.train_samples = FLAGS_train_samples;
  dopt.test_samples = FLAGS_test_samples;
  dopt.synthetic.seed = FLAGS_seed;
  dopt.synthetic.zipf_exponent = FLAGS_zipf;
  dopt.synthetic.interaction_std = FLAGS_interaction_std;
  dopt.synthetic.bias_std = FLAGS_bias_std;
  dopt.synthetic.planted_dim = FLAGS_planted_dim;
  dopt.synthetic.cardinalities = tw::CriteoLikeCardinalities(FLAGS_synthetic_max_cardinality);

  // The model's shape follows the data's.
  auto probe = tw::OpenTestData(dopt);
  if (!probe.ok()) return Fail(probe.status());
  tw::ModelConfig mc;
  mc.num_dense = (*probe)->schema().num_dense;
  mc.num_fields = (*probe)->schema().num_fields;
  mc.embedding_dim = FLAGS_embedding_dim;
  auto bottom = tw::ParseLayerWidths(FLAGS_bottom_mlp);
  if (!bottom.ok()) return Fail(bottom.status());
  auto top = tw::ParseLayerWidths(FLAGS_top_mlp);
  if (!top.ok()) return Fail(top.status());
  mc.bottom_mlp = *bottom;
  mc.top_mlp = *top;
  mc.pooling = FLAGS_pooling == "mean" ? tw::Pooling::kMean : tw::Pooling::kSum;
  mc.deep = FLAGS_deep;
  mc.wide = FLAGS_wide;
  mc.table_prefix = FLAGS_job;
  mc.embedding_optimizer.learning_rate = static_cast<float>(FLAGS_emb_lr);
  mc.embedding_optimizer.initial_accumulator = static_cast<float>(FLAGS_emb_init_acc);
  mc.dense_optimizer.learning_rate = static_cast<float>(FLAGS_dense_lr);
  mc.wide_optimizer.learning_rate = static_cast<float>(FLAGS_wide_lr);
  auto layout = tw::ModelLayout::Create(mc);
  if (!layout.ok()) return Fail(layout.status());

  tw::TrainerOptions topt;
  topt.batch_size = FLAGS_batch_size;
  topt.max_steps = FLAGS_max_steps;
  topt.prefetch = FLAGS_prefetch;
  topt.staleness = staleness;
  topt.worker_id = FLAGS_worker_id;
  topt.job = FLAGS_job;
  topt.resume = FLAGS_resume;
  topt.progress_interval_s = FLAGS_progress_interval_s;
  topt.on_progress = [](const tw::TrainProgress& p) {
    std::printf("worker %u step %llu samples %llu %.0f samples/s loss %.4f running_auc %.4f\n",
                FLAGS_worker_id, static_cast<unsigned long long>(p.step),
                static_cast<unsigned long long>(p.samples), p.samples_per_s, p.loss, p.running_auc);
    std::fflush(stdout);
  };

  // Every rank's set-up and training; a rank that fails aborts the group (RunLocalRanks), so
  // that no other rank waits for it forever.
  tw::TrainResult tr;
  auto run_rank = [&](uint32_t local) -> tessera::Status {
    std::unique_ptr<tw::LocalReducer> reducer;
    if (group) {
      TESSERA_ASSIGN_OR_RETURN(reducer, group->Join(local));
    }
    tw::DataSourceOptions mine = dopt;
    mine.rank = FLAGS_worker_id * nl + local;
    TESSERA_ASSIGN_OR_RETURN(auto reader, tw::OpenTrainData(mine));
    std::unique_ptr<tw::Backend> backend;
    if (FLAGS_backend == "cuda") {
      TESSERA_ASSIGN_OR_RETURN(backend,
                               tw::CreateCudaBackend(*layout, tw::DeviceOfLocalRank(local, gpus)));
    } else {
      TESSERA_ASSIGN_OR_RETURN(backend, tw::CreateCpuBackend(*layout, {FLAGS_threads}));
    }
    TESSERA_ASSIGN_OR_RETURN(auto trainer,
                             tw::Trainer::Create(topt, *layout, local == 0 ? store.get() : nullptr,
                                                 backend.get(), reader.get(), reducer.get()));
    TESSERA_RETURN_IF_ERROR(trainer->Init());
    TESSERA_ASSIGN_OR_RETURN(tw::TrainResult r, trainer->Train());
    if (local == 0) tr = r;
    return tessera::Status::OK();
  };
  tessera::Status trained = tw::RunLocalRanks(nl, group.get(), run_rank);
  if (!trained.ok()) return Fail(trained);
  std::printf(
      "worker %u trained %llu samples in %.1f s (%.0f samples/s), %llu steps "
      "(%llu resumed), train loss %.4f\n",
      FLAGS_worker_id, static_cast<unsigned long long>(tr.samples), tr.seconds, tr.samples_per_s,
      static_cast<unsigned long long>(tr.steps), static_cast<unsigned long long>(tr.resumed_steps),
      tr.train_loss);
  std::fflush(stdout);
  if (!FLAGS_evaluate) return 0;

  tessera::Status s = store->Barrier(FLAGS_job + "/train_done");
  if (!s.ok()) return Fail(s);
  if (FLAGS_worker_id != 0) return 0;
  auto test = tw::OpenTestData(dopt);
  if (!test.ok()) return Fail(test.status());
  auto backend = tw::CreateCpuBackend(*layout, {std::max(FLAGS_threads, 2)});
  if (!backend.ok()) return Fail(backend.status());
  auto ev = tw::Evaluate(*layout, store.get(), backend->get(), test->get());
  if (!ev.ok()) return Fail(ev.status());
  std::printf("test samples %llu auc %.4f logloss %.4f",
              static_cast<unsigned long long>(ev->samples), ev->auc, ev->logloss);
  if (std::isfinite(ev->oracle_auc)) {
    std::printf(" oracle_auc %.4f oracle_logloss %.4f (gap %.4f)", ev->oracle_auc,
                ev->oracle_logloss, ev->oracle_auc - ev->auc);
  }
  std::printf("\n");
  // The report line (examples/ctr/README.md lists its keys). The training figures are worker
  // 0's own (its node's local ranks together, this run only): this process does not see the
  // other workers' counts. "data" stays the first key (scripts find the line by it); NaN
  // (no oracle) is written as null.
  nlohmann::ordered_json report;
  report["data"] = FLAGS_data;
  report["workers"] = FLAGS_num_workers;
  report["local_ranks"] = nl;
  report["consistency"] = FLAGS_consistency;
  report["prefetch"] = FLAGS_prefetch;
  report["model"] = FLAGS_deep ? (FLAGS_wide ? "dlrm+wide" : "dlrm") : "wide";
  report["train_samples_worker0"] = tr.samples;
  report["train_seconds"] = tr.seconds;
  report["samples_per_s_worker0"] = tr.samples_per_s;
  report["train_loss"] = tr.train_loss;
  report["test_samples"] = ev->samples;
  report["test_auc"] = ev->auc;
  report["test_logloss"] = ev->logloss;
  report["oracle_auc"] = ev->oracle_auc;
  report["oracle_logloss"] = ev->oracle_logloss;
  // A --data path need not be UTF-8; replace what is not rather than throw.
  std::printf("%s\n", report.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  return 0;
}
