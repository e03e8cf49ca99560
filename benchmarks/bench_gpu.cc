// bench_gpu: the GPU side of the worker, each figure next to its bound or its baseline in the
// same run.
//  1. The embedding-bag kernels alone (forward, backward) as a fraction of the device's memory
//     bandwidth: the bytes they must move over the time they take, against the peak from the
//     device's memory clock and bus width, and against a device-to-device copy measured here.
//  2. The CUDA backend's ForwardBackward against the CPU backend (all cores) on the same model
//     and batches: samples/s of each, alternating repetitions; and the CUDA backend with the
//     next batch staged (Backend::Stage) before each call, its upload overlapping the kernels.
//  3. The NCCL reducer over min(GPUs, 2) ranks: ReduceSumOnDevice (the training path) against
//     the host-staged ReduceSum of the same floats, in GB/s of the reduced data.
// Without a GPU (or in a build without CUDA) it says why, prints a JSON line with
// "skipped": true and exits 0. The last line of output is always one JSON object.
#include <gflags/gflags.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "benchmarks/bench_stats.h"
#include "worker/backend.h"
#include "worker/batch.h"
#include "worker/embedding_bag.h"
#include "worker/local_reducer.h"
#include "worker/model.h"
#include "worker/synthetic_data.h"

#ifdef TESSERA_WITH_CUDA
#include <cuda_runtime.h>
#endif

DEFINE_bool(quick, false, "Short run: fewer repetitions and smaller sizes");
DEFINE_int32(reps, 0, "Repetitions of each measurement (0: 5 with --quick, else 20)");
DEFINE_uint64(table_rows, 4000000, "Embedding-bag benchmark: table rows (not L2-resident)");
DEFINE_uint32(bags, 26 * 65536, "Embedding-bag benchmark: bags per call (samples x fields)");
DEFINE_string(dims, "8,16,64,128", "Embedding-bag benchmark: widths, comma-separated");
DEFINE_uint32(batch_size, 4096, "Backend comparison: samples per ForwardBackward");
DEFINE_uint32(embedding_dim, 8, "Backend comparison: embedding width (tessera-worker's)");
DEFINE_string(bottom_mlp, "64", "Backend comparison: bottom MLP hidden widths");
DEFINE_string(top_mlp, "64", "Backend comparison: top MLP hidden widths");
DEFINE_int32(cpu_threads, 0, "Backend comparison: CPU backend threads (0: all cores)");
DEFINE_uint64(reduce_floats, 16 << 20, "NCCL benchmark: floats reduced per call");

namespace tw = tessera::worker;
using tessera::Status;

namespace {

std::string Json(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

int Skip(const std::string& why) {
  std::printf("bench_gpu: skipped: %s\n", why.c_str());
  std::printf("{\"bench\": \"gpu\", \"skipped\": true, \"reason\": %s}\n", Json(why).c_str());
  return 0;
}

#ifdef TESSERA_WITH_CUDA

int Fail(const std::string& what) {
  std::fprintf(stderr, "bench_gpu: %s\n", what.c_str());
  return 1;
}

#define BENCH_CUDA(expr)                                                                    \
  do {                                                                                      \
    const cudaError_t e_ = (expr);                                                          \
    if (e_ != cudaSuccess) return Fail(std::string(#expr) + ": " + cudaGetErrorString(e_)); \
  } while (0)
#define BENCH_OK(expr)                                     \
  do {                                                     \
    const Status s_ = (expr);                              \
    if (!s_.ok()) return Fail(#expr ": " + s_.ToString()); \
  } while (0)

// Device memory freed at scope exit.
template <typename T>
struct DeviceArray {
  T* p = nullptr;
  ~DeviceArray() {
    if (p != nullptr) cudaFree(p);
  }
  cudaError_t Alloc(size_t n) { return cudaMalloc(reinterpret_cast<void**>(&p), n * sizeof(T)); }
};

struct Figures {
  std::string device;
  double peak_gbs = 0, copy_gbs = 0;
  struct Bag {
    uint32_t dim = 0;
    uint32_t keys_per_bag = 0;
    double fwd_gbs = 0, bwd_gbs = 0;
  };
  std::vector<Bag> bags;
  double cuda_sps = 0, cpu_sps = 0;
  // ForwardBackward with the next batch staged (Backend::Stage) before each call.
  double cuda_staged_sps = 0;
  int cpu_threads = 0;
  uint32_t nccl_ranks = 0;
  double nccl_device_gbs = 0, nccl_host_gbs = 0;
};

// Seconds per call of fn() (enqueued on `stream`) over `reps` calls, timed by CUDA events, the
// median of 3 batches.
template <typename Fn>
double TimeOnDevice(cudaStream_t stream, int reps, Fn fn) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<double> per_call;
  for (int round = 0; round < 3; ++round) {
    cudaEventRecord(a, stream);
    for (int i = 0; i < reps; ++i) fn();
    cudaEventRecord(b, stream);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    per_call.push_back(ms * 1e-3 / reps);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return tessera::bench::Median(per_call);
}

int MeasureBandwidth(int reps, Figures* f) {
  cudaDeviceProp prop;
  BENCH_CUDA(cudaGetDeviceProperties(&prop, 0));
  int clock_khz = 0, bus_bits = 0;
  BENCH_CUDA(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, 0));
  BENCH_CUDA(cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, 0));
  f->device = prop.name;
  f->peak_gbs = 2.0 * clock_khz * 1e3 * (bus_bits / 8.0) / 1e9;  // double data rate
  const size_t bytes = size_t{1} << 30;
  DeviceArray<char> src, dst;
  BENCH_CUDA(src.Alloc(bytes));
  BENCH_CUDA(dst.Alloc(bytes));
  BENCH_CUDA(cudaMemset(src.p, 1, bytes));
  const double s = TimeOnDevice(nullptr, reps, [&] {
    cudaMemcpyAsync(dst.p, src.p, bytes, cudaMemcpyDeviceToDevice, nullptr);
  });
  f->copy_gbs = 2.0 * bytes / s / 1e9;  // read + write
  std::printf(
      "device %s: %d SMs, %.1f GiB, memory peak %.0f GB/s (clock x bus), "
      "device-to-device copy %.0f GB/s (read + write)\n",
      prop.name, prop.multiProcessorCount, prop.totalGlobalMem / double(1 << 30), f->peak_gbs,
      f->copy_gbs);
  return 0;
}

// The embedding-bag kernels on a table that does not fit in L2, rows drawn uniformly.
int MeasureEmbeddingBag(uint32_t dim, uint32_t keys_per_bag, int reps, Figures* f) {
  const uint64_t rows = FLAGS_table_rows;
  const uint32_t bags = FLAGS_bags;
  const uint64_t entries = uint64_t{bags} * keys_per_bag;
  std::vector<uint32_t> offsets(bags + 1), idx(entries);
  std::vector<float> weights(keys_per_bag > 1 ? entries : 0);
  std::mt19937_64 rng(dim * 7 + keys_per_bag);
  for (uint32_t i = 0; i <= bags; ++i) offsets[i] = i * keys_per_bag;
  for (auto& r : idx) r = static_cast<uint32_t>(rng() % rows);
  for (auto& w : weights) w = 0.5f + (rng() % 1000) / 1000.0f;
  DeviceArray<uint32_t> d_off, d_rows;
  DeviceArray<float> d_w, table, out, d_out, grad, inv;
  BENCH_CUDA(d_off.Alloc(offsets.size()));
  BENCH_CUDA(d_rows.Alloc(idx.size()));
  BENCH_CUDA(d_w.Alloc(std::max<size_t>(weights.size(), 1)));
  BENCH_CUDA(table.Alloc(rows * dim));
  BENCH_CUDA(grad.Alloc(rows * dim));
  BENCH_CUDA(out.Alloc(size_t{bags} * dim));
  BENCH_CUDA(d_out.Alloc(size_t{bags} * dim));
  BENCH_CUDA(inv.Alloc(bags));
  BENCH_CUDA(cudaMemcpy(d_off.p, offsets.data(), offsets.size() * 4, cudaMemcpyHostToDevice));
  BENCH_CUDA(cudaMemcpy(d_rows.p, idx.data(), idx.size() * 4, cudaMemcpyHostToDevice));
  if (!weights.empty()) {
    BENCH_CUDA(cudaMemcpy(d_w.p, weights.data(), weights.size() * 4, cudaMemcpyHostToDevice));
  }
  BENCH_CUDA(cudaMemset(table.p, 0, rows * dim * sizeof(float)));
  BENCH_CUDA(cudaMemset(grad.p, 0, rows * dim * sizeof(float)));
  BENCH_CUDA(cudaMemset(d_out.p, 0, size_t{bags} * dim * sizeof(float)));
  tw::EmbeddingBagArgs a;
  a.offsets = d_off.p;
  a.rows = d_rows.p;
  a.weights = weights.empty() ? nullptr : d_w.p;
  a.table = table.p;
  a.num_bags = bags;
  a.dim = dim;
  a.mean = keys_per_bag > 1;
  a.out = out.p;
  a.inv_denom = a.mean ? inv.p : nullptr;
  BENCH_OK(tw::EmbeddingBagForward(a, nullptr));  // warm-up, and a launch check
  BENCH_OK(tw::EmbeddingBagBackward(a, d_out.p, grad.p, nullptr));
  BENCH_CUDA(cudaDeviceSynchronize());
  // Bytes each pass must move at the least: its indices and weights, a 32-byte sector (or the
  // row, when wider) per entry's row, its outputs; the backward pass reads and writes each
  // gradient row it adds into.
  const double row_bytes = std::max(32.0, dim * 4.0);
  const double index_bytes = 4.0 * (bags + 1) + 4.0 * entries + (a.weights ? 4.0 * entries : 0);
  const double fwd_bytes =
      index_bytes + entries * row_bytes + 4.0 * bags * dim + (a.mean ? 4.0 * bags : 0);
  const double bwd_bytes =
      index_bytes + 4.0 * bags * dim + 2.0 * entries * row_bytes + (a.mean ? 4.0 * bags : 0);
  const double fwd =
      TimeOnDevice(nullptr, reps, [&] { static_cast<void>(tw::EmbeddingBagForward(a, nullptr)); });
  const double bwd = TimeOnDevice(nullptr, reps, [&] {
    static_cast<void>(tw::EmbeddingBagBackward(a, d_out.p, grad.p, nullptr));
  });
  BENCH_CUDA(cudaGetLastError());
  Figures::Bag b{dim, keys_per_bag, fwd_bytes / fwd / 1e9, bwd_bytes / bwd / 1e9};
  std::printf(
      "embedding bag dim %3u, %u key%s per bag%s: forward %7.1f us %6.0f GB/s = %4.0f%% "
      "of peak, %4.0f%% of copy; backward %7.1f us %6.0f GB/s = %4.0f%% of peak, %4.0f%% "
      "of copy\n",
      dim, keys_per_bag, keys_per_bag == 1 ? "" : "s", a.mean ? " (weighted, mean)" : " (sum)",
      fwd * 1e6, b.fwd_gbs, 100 * b.fwd_gbs / f->peak_gbs, 100 * b.fwd_gbs / f->copy_gbs, bwd * 1e6,
      b.bwd_gbs, 100 * b.bwd_gbs / f->peak_gbs, 100 * b.bwd_gbs / f->copy_gbs);
  f->bags.push_back(b);
  return 0;
}

// One prepared batch of the generated Criteo-shaped data, with random parameters.
struct Prepared {
  tw::Batch batch;
  tw::IndexedBatch index;
  std::vector<float> emb, wide, params;
  tw::ModelInput Input() const {
    tw::ModelInput in;
    in.batch_size = batch.size;
    in.dense = batch.dense.data();
    in.labels = batch.labels.data();
    in.offsets = batch.offsets.data();
    in.rows = index.rows.data();
    in.num_rows = static_cast<uint32_t>(index.unique_keys.size());
    in.embeddings = emb.data();
    in.wide = wide.data();
    in.params = params.data();
    return in;
  }
};

int MeasureBackends(int reps, Figures* f) {
  tw::ModelConfig mc;
  mc.embedding_dim = FLAGS_embedding_dim;
  auto bottom = tw::ParseLayerWidths(FLAGS_bottom_mlp);
  auto top = tw::ParseLayerWidths(FLAGS_top_mlp);
  if (!bottom.ok() || !top.ok()) return Fail("bad --bottom_mlp or --top_mlp");
  mc.bottom_mlp = *bottom;
  mc.top_mlp = *top;
  auto layout = tw::ModelLayout::Create(mc);
  if (!layout.ok()) return Fail(layout.status().ToString());
  tw::SyntheticOptions so;
  so.cardinalities = tw::CriteoLikeCardinalities(200000);
  auto gen = tw::SyntheticReader::Create(so);
  if (!gen.ok()) return Fail(gen.status().ToString());
  std::vector<Prepared> batches(4);
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-0.05f, 0.05f);
  for (Prepared& p : batches) {
    p.batch.Clear((*gen)->schema());
    auto n = (*gen)->Read(FLAGS_batch_size, &p.batch);
    if (!n.ok()) return Fail(n.status().ToString());
    tw::IndexBatch(p.batch, &p.index);
    p.emb.resize(p.index.unique_keys.size() * mc.embedding_dim);
    p.wide.resize(p.index.unique_keys.size());
    p.params.resize(layout->num_params());
    for (float& x : p.emb) x = u(rng);
    for (float& x : p.wide) x = u(rng);
    for (float& x : p.params) x = u(rng);
  }
  f->cpu_threads = FLAGS_cpu_threads > 0 ? FLAGS_cpu_threads
                                         : static_cast<int>(std::thread::hardware_concurrency());
  auto cpu = tw::CreateCpuBackend(*layout, {f->cpu_threads});
  auto gpu = tw::CreateCudaBackend(*layout, 0);
  if (!cpu.ok() || !gpu.ok()) return Fail("backends: " + gpu.status().ToString());
  // Variant 2: the CUDA backend with the next batch staged before each call, as a trainer that
  // overlaps the next upload with this step's kernels.
  tw::Backend* backends[3] = {gpu->get(), cpu->get(), gpu->get()};
  std::vector<double> sps[3];
  std::vector<float> probs(FLAGS_batch_size);
  tw::ModelGrads grads;
  Status error;
  // Warm-up: buffers grow to their size, cuBLAS picks its kernels.
  for (tw::Backend* b : backends) {
    for (const Prepared& p : batches)
      error = b->ForwardBackward(p.Input(), 1.0f, probs.data(), &grads);
  }
  if (!error.ok()) return Fail(error.ToString());
  const int calls = FLAGS_quick ? 4 : 8;
  tessera::bench::ForEachAlternating(3, reps, [&](size_t v, int) {
    const auto start = std::chrono::steady_clock::now();
    if (v == 2) error = backends[v]->Stage(batches[0].Input());
    for (int i = 0; i < calls && error.ok(); ++i) {
      const Prepared& p = batches[i % batches.size()];
      if (v == 2 && i + 1 < calls) {
        error = backends[v]->Stage(batches[(i + 1) % batches.size()].Input());
        if (!error.ok()) break;
      }
      error = backends[v]->ForwardBackward(p.Input(), 1.0f, probs.data(), &grads);
    }
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    sps[v].push_back(calls * static_cast<double>(FLAGS_batch_size) / s);
    return error.ok();
  });
  if (!error.ok()) return Fail(error.ToString());
  f->cuda_sps = tessera::bench::Median(sps[0]);
  f->cpu_sps = tessera::bench::Median(sps[1]);
  f->cuda_staged_sps = tessera::bench::Median(sps[2]);
  std::printf(
      "ForwardBackward, batch %u, embedding %u, MLPs %s / %s (host inputs, one upload and "
      "one download per call): CUDA %.0f samples/s, CPU (%d threads) %.0f samples/s: "
      "%.1fx; CUDA with the next batch staged (Stage) %.0f samples/s: %.2fx unstaged\n",
      FLAGS_batch_size, mc.embedding_dim, FLAGS_bottom_mlp.c_str(), FLAGS_top_mlp.c_str(),
      f->cuda_sps, f->cpu_threads, f->cpu_sps, f->cuda_sps / f->cpu_sps, f->cuda_staged_sps,
      f->cuda_staged_sps / f->cuda_sps);
  return 0;
}

int MeasureNccl(int count, int reps, Figures* f) {
  const uint32_t n = static_cast<uint32_t>(std::min(count, 2));
  tw::NcclReduceGroupOptions o;
  o.size = n;
  auto group = tw::CreateNcclReduceGroup(o);
  if (!group.ok()) return Fail(group.status().ToString());
  const size_t floats = FLAGS_reduce_floats;
  std::vector<double> device_s, host_s;
  std::vector<Status> errors(n);
  std::vector<std::thread> threads;
  for (uint32_t r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      errors[r] = [&]() -> Status {
        TESSERA_ASSIGN_OR_RETURN(auto member, (*group)->Join(r));
        cudaSetDevice(static_cast<int>(r));
        float* data = nullptr;
        cudaStream_t stream = nullptr;
        if (cudaMalloc(&data, floats * sizeof(float)) != cudaSuccess ||
            cudaStreamCreate(&stream) != cudaSuccess) {
          return Status::ResourceExhausted("device memory for the NCCL benchmark");
        }
        cudaMemsetAsync(data, 0, floats * sizeof(float), stream);
        std::vector<float> host(floats, 1.0f);
        const tw::DeviceSpan span{data, floats, false};
        Status s;
        for (int rep = 0; rep < reps + 1 && s.ok(); ++rep) {  // the first one warms up
          auto t0 = std::chrono::steady_clock::now();
          s = member->ReduceSumOnDevice({&span, 1}, stream);
          if (s.ok()) s = member->WaitDevice(stream);
          auto t1 = std::chrono::steady_clock::now();
          if (s.ok()) s = member->ReduceSum(host);
          auto t2 = std::chrono::steady_clock::now();
          if (r == 0 && rep > 0) {
            device_s.push_back(std::chrono::duration<double>(t1 - t0).count());
            host_s.push_back(std::chrono::duration<double>(t2 - t1).count());
          }
        }
        cudaStreamDestroy(stream);
        cudaFree(data);
        return s;
      }();
      if (!errors[r].ok()) (*group)->Abort(errors[r]);
    });
  }
  for (auto& t : threads) t.join();
  for (const Status& s : errors) {
    if (!s.ok()) return Fail("NCCL: " + s.ToString());
  }
  const double bytes = floats * 4.0;
  f->nccl_ranks = n;
  f->nccl_device_gbs = bytes / tessera::bench::Median(device_s) / 1e9;
  f->nccl_host_gbs = bytes / tessera::bench::Median(host_s) / 1e9;
  std::printf(
      "NCCL reduce to the leader, %u rank%s, %.0f MB: on the device %.1f GB/s, "
      "host-staged %.1f GB/s (%.1fx)%s\n",
      n, n == 1 ? "" : "s", bytes / 1e6, f->nccl_device_gbs, f->nccl_host_gbs,
      f->nccl_device_gbs / f->nccl_host_gbs,
      n == 1 ? " [one GPU: no transfer between GPUs; NCCL's overhead alone]" : "");
  return 0;
}

#endif  // TESSERA_WITH_CUDA

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage(
      "The worker's GPU kernels, backend and NCCL reducer against their bounds");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  auto count = tw::CudaDeviceCount();
  if (!count.ok()) return Skip(count.status().message());
#ifndef TESSERA_WITH_CUDA
  return Skip("this build has no CUDA");
#else
  const int reps = FLAGS_reps > 0 ? FLAGS_reps : (FLAGS_quick ? 5 : 20);
  if (FLAGS_quick) {
    FLAGS_table_rows = std::min<uint64_t>(FLAGS_table_rows, 2000000);
    FLAGS_bags = std::min<uint32_t>(FLAGS_bags, 26 * 16384);
  }
  Figures f;
  if (int rc = MeasureBandwidth(reps, &f); rc != 0) return rc;
  auto dims = tw::ParseLayerWidths(FLAGS_dims);
  if (!dims.ok()) return Fail(dims.status().ToString());
  for (uint32_t dim : *dims) {
    if (int rc = MeasureEmbeddingBag(dim, 1, reps, &f); rc != 0) return rc;
  }
  if (int rc = MeasureEmbeddingBag(dims->front(), 4, reps, &f); rc != 0) return rc;
  if (int rc = MeasureBackends(FLAGS_quick ? 3 : 7, &f); rc != 0) return rc;
  if (int rc = MeasureNccl(*count, reps, &f); rc != 0) return rc;

  std::string bags = "[";
  for (size_t i = 0; i < f.bags.size(); ++i) {
    const Figures::Bag& b = f.bags[i];
    char buf[256];
    std::snprintf(buf, sizeof(buf),
                  "%s{\"dim\": %u, \"keys_per_bag\": %u, \"forward_gbs\": %.1f, "
                  "\"forward_of_peak\": %.3f, \"backward_gbs\": %.1f, \"backward_of_peak\": %.3f}",
                  i ? ", " : "", b.dim, b.keys_per_bag, b.fwd_gbs, b.fwd_gbs / f.peak_gbs,
                  b.bwd_gbs, b.bwd_gbs / f.peak_gbs);
    bags += buf;
  }
  bags += "]";
  const Figures::Bag& first = f.bags.front();
  std::printf(
      "{\"bench\": \"gpu\", \"skipped\": false, \"device\": %s, \"gpus\": %d, \"peak_gbs\": %.0f, "
      "\"copy_gbs\": %.0f, \"emb_forward_of_peak\": %.3f, \"emb_backward_of_peak\": %.3f, "
      "\"emb_forward_of_copy\": %.3f, \"emb_backward_of_copy\": %.3f, \"embedding_bag\": %s, "
      "\"cuda_samples_per_s\": %.0f, \"cpu_samples_per_s\": %.0f, \"cpu_threads\": %d, "
      "\"cuda_vs_cpu\": %.2f, \"cuda_staged_samples_per_s\": %.0f, \"nccl_ranks\": %u, "
      "\"nccl_device_gbs\": %.2f, \"nccl_host_staged_gbs\": %.2f}\n",
      Json(f.device).c_str(), *count, f.peak_gbs, f.copy_gbs, first.fwd_gbs / f.peak_gbs,
      first.bwd_gbs / f.peak_gbs, first.fwd_gbs / f.copy_gbs, first.bwd_gbs / f.copy_gbs,
      bags.c_str(), f.cuda_sps, f.cpu_sps, f.cpu_threads, f.cuda_sps / f.cpu_sps, f.cuda_staged_sps,
      f.nccl_ranks, f.nccl_device_gbs, f.nccl_host_gbs);
  return 0;
#endif
}
