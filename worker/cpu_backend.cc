#include <memory>
#include <string>

#include "worker/backend.h"
#include "worker/cpu_model_internal.h"

namespace tessera::worker {
namespace internal {

#ifdef TESSERA_HAVE_AVX2_GEMMS
namespace avx2 {
// cpu_gemm_avx2.cc (compiled with -mavx2 -mfma).
void GemmABtF(int64_t m, int64_t n, int64_t k, const float* a, const float* b, float* c,
              bool accumulate);
void GemmAtBF(int64_t m, int64_t n, int64_t k, const float* a, const float* b, float* c,
              bool accumulate);
void GemmABF(int64_t m, int64_t n, int64_t k, const float* a, const float* b, float* c,
             bool accumulate);
}  // namespace avx2

bool CpuHasAvx2Fma() {
  // libgcc's and compiler-rt's checks include the OS's support of the AVX register state.
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
#endif

const CpuGemms<float>* FloatGemmsFor(std::string_view isa) {
  if (isa == "generic") return &GenericGemms<float>();
  if (isa != "auto" && isa != "avx2") return nullptr;
#ifdef TESSERA_HAVE_AVX2_GEMMS
  static const CpuGemms<float> avx2_gemms{&avx2::GemmABtF, &avx2::GemmAtBF, &avx2::GemmABF,
                                          "avx2"};
  if (CpuHasAvx2Fma()) return &avx2_gemms;
#endif
  return isa == "auto" ? &GenericGemms<float>() : nullptr;
}

}  // namespace internal

namespace {

class CpuBackend final : public Backend {
 public:
  CpuBackend(const ModelLayout& layout, const CpuBackendOptions& options,
             const internal::CpuGemms<float>& gemms)
      : layout_(layout), model_(layout_, options.threads, gemms) {}
  std::string_view name() const override { return "cpu"; }

  Status Forward(const ModelInput& in, float* probs) override {
    TESSERA_RETURN_IF_ERROR(CheckModelInput(layout_.config(), in, false));
    model_.Run(Convert(in), 0.0f, probs, nullptr);
    return Status::OK();
  }

  Status ForwardBackward(const ModelInput& in, float loss_scale, float* probs,
                         ModelGrads* grads) override {
    TESSERA_RETURN_IF_ERROR(CheckModelInput(layout_.config(), in, true));
    model_.Run(Convert(in), loss_scale, probs, &scratch_);
    grads->embeddings.swap(scratch_.embeddings);
    grads->wide.swap(scratch_.wide);
    grads->params.swap(scratch_.params);
    grads->loss_sum = scratch_.loss_sum;
    return Status::OK();
  }

 private:
  static internal::InputT<float> Convert(const ModelInput& in) {
    internal::InputT<float> t;
    t.batch_size = in.batch_size;
    t.dense = in.dense;
    t.labels = in.labels;
    t.offsets = in.offsets;
    t.rows = in.rows;
    t.weights = in.weights;
    t.num_rows = in.num_rows;
    t.embeddings = in.embeddings;
    t.wide = in.wide;
    t.params = in.params;
    return t;
  }

  ModelLayout layout_;
  internal::CpuModel<float> model_;
  internal::GradsT<float> scratch_;
};

}  // namespace

std::string_view CpuBackendIsa(std::string_view isa) {
  const internal::CpuGemms<float>* gemms = internal::FloatGemmsFor(isa);
  return gemms == nullptr ? std::string_view() : std::string_view(gemms->isa);
}

Result<std::unique_ptr<Backend>> CreateCpuBackend(const ModelLayout& layout,
                                                  const CpuBackendOptions& options) {
  if (options.threads < 1) return Status::InvalidArgument("threads must be >= 1");
  const internal::CpuGemms<float>* gemms = internal::FloatGemmsFor(options.isa);
  if (gemms == nullptr) {
    if (options.isa == "avx2") {
      return Status::FailedPrecondition(
          "CPU backend: isa avx2 needs a build with AVX2 kernels and a CPU with AVX2 and FMA");
    }
    return Status::InvalidArgument("CPU backend: isa must be auto, generic or avx2, not '" +
                                   options.isa + "'");
  }
  return std::unique_ptr<Backend>(new CpuBackend(layout, options, *gemms));
}

}  // namespace tessera::worker
