#include "models/bn_silu.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <vector>

#include "models/bn_silu_kernels.h"

namespace yolo8 {

namespace {

std::atomic<int> g_fusion{-1};  // -1: this CPU's default (fusion_pays_here), 0: off, 1: on

// The layout of a 4-D tensor as the kernels see it: channels-last rows or contiguous planes.
struct Layout {
  bool channels_last = false;
  int64_t n = 0, c = 0, s = 0;  // batch, channels, H*W
  // Channels-last work is split into blocks of whole rows of about this many values; the split depends on the
  // shape only, so sums are added in the same order whatever the thread count.
  static constexpr int64_t kBlockValues = 16384;
  int64_t rows() const { return n * s; }
  int64_t rows_per_block() const { return std::max<int64_t>(1, kBlockValues / c); }
  int64_t blocks() const { return (rows() + rows_per_block() - 1) / rows_per_block(); }
};

// bfloat16 is accepted in channels-last memory only (batch_norm_silu_supported), which is rows even where it is
// also contiguous (1×1 planes).
Layout layout_of(const torch::Tensor& x) {
  Layout l;
  l.channels_last =
      x.scalar_type() == torch::kBFloat16 || (!x.is_contiguous() && x.is_contiguous(torch::MemoryFormat::ChannelsLast));
  l.n = x.size(0);
  l.c = x.size(1);
  l.s = x.size(2) * x.size(3);
  return l;
}

torch::Tensor dense(const torch::Tensor& t, const Layout& l) {
  return t.contiguous(l.channels_last ? torch::MemoryFormat::ChannelsLast : torch::MemoryFormat::Contiguous);
}

// The bits of a bfloat16 tensor's values, as the bfloat16 loops take them.
const uint16_t* bf16_bits(const torch::Tensor& t) {
  return reinterpret_cast<const uint16_t*>(t.const_data_ptr<at::BFloat16>());
}
uint16_t* bf16_bits(torch::Tensor& t) { return reinterpret_cast<uint16_t*>(t.mutable_data_ptr<at::BFloat16>()); }

// Per-channel (Σ a, Σ b) over the batch, from per-block (channels-last) or per-plane partial sums added in order.
template <typename RowsFn, typename PlaneFn>
std::pair<std::vector<double>, std::vector<double>> channel_sums(const Layout& l, RowsFn rows_fn, PlaneFn plane_fn) {
  const int64_t parts = l.channels_last ? l.blocks() : l.n;
  std::vector<double> pa(static_cast<size_t>(parts * l.c), 0.0), pb(pa.size(), 0.0);
  if (l.channels_last) {
    const int64_t per = l.rows_per_block();
    at::parallel_for(0, parts, 1, [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) {
        const int64_t r0 = b * per;
        rows_fn(r0, std::min(per, l.rows() - r0), pa.data() + b * l.c, pb.data() + b * l.c);
      }
    });
  } else {
    at::parallel_for(0, l.n * l.c, 1, [&](int64_t begin, int64_t end) {
      for (int64_t p = begin; p < end; ++p) plane_fn(p, pa.data() + p, pb.data() + p);
    });
  }
  std::vector<double> a(static_cast<size_t>(l.c), 0.0), b(a.size(), 0.0);
  for (int64_t part = 0; part < parts; ++part) {
    for (int64_t k = 0; k < l.c; ++k) {
      a[k] += pa[part * l.c + k];
      b[k] += pb[part * l.c + k];
    }
  }
  return {a, b};
}

// Elementwise pass over every value, channels-last rows in blocks or contiguous planes.
template <typename RowsFn, typename PlaneFn>
void for_each_part(const Layout& l, RowsFn rows_fn, PlaneFn plane_fn) {
  if (l.channels_last) {
    const int64_t per = l.rows_per_block();
    at::parallel_for(0, l.blocks(), 1, [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) rows_fn(b * per, std::min(per, l.rows() - b * per));
    });
  } else {
    at::parallel_for(0, l.n * l.c, 1, [&](int64_t begin, int64_t end) {
      for (int64_t p = begin; p < end; ++p) plane_fn(p);
    });
  }
}

// Per-channel values in plain loops: a tensor op each was ~20 ATen calls per Conv and step, on the main thread.
// The file is compiled without contraction (models/CMakeLists.txt), so each line rounds as the float tensor op it
// replaces did.
const float* floats(const torch::Tensor& t) { return t.data_ptr<float>(); }

struct Coefficients {
  std::vector<float> alpha, beta;  // BN as x * alpha + beta, as ATen's CPU batch norm applies it
};

Coefficients coefficients(const torch::Tensor& weight, const torch::Tensor& bias, const torch::Tensor& mean,
                          const torch::Tensor& invstd) {
  const int64_t c = weight.numel();
  Coefficients k{std::vector<float>(static_cast<size_t>(c)), std::vector<float>(static_cast<size_t>(c))};
  const float *w = floats(weight), *b = floats(bias), *m = floats(mean), *is = floats(invstd);
  for (int64_t i = 0; i < c; ++i) {
    k.alpha[i] = is[i] * w[i];
    const float shift = m[i] * k.alpha[i];
    k.beta[i] = b[i] - shift;
  }
  return k;
}

// A float tensor of c values from doubles or floats.
template <typename T>
torch::Tensor float_tensor(const std::vector<T>& values) {
  torch::Tensor t = torch::empty({static_cast<int64_t>(values.size())}, torch::kFloat);
  std::copy(values.begin(), values.end(), t.data_ptr<float>());
  return t;
}

class BatchNormSilu : public torch::autograd::Function<BatchNormSilu> {
 public:
  // mean and invstd are the batch statistics of x (constants here; backward carries their dependence on x).
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, const torch::Tensor& bias, const torch::Tensor& mean,
                               const torch::Tensor& invstd) {
    const Layout l = layout_of(x);
    const Coefficients k = coefficients(weight, bias, mean, invstd);
    torch::Tensor y = torch::empty_like(x);
    const float* alpha = k.alpha.data();
    const float* beta = k.beta.data();
    if (x.scalar_type() == torch::kBFloat16) {
      const BnSiluBf16Kernels& kern = *bn_silu_bf16_kernels();
      const uint16_t* xp = bf16_bits(x);
      uint16_t* yp = bf16_bits(y);
      for_each_part(
          l, [&](int64_t r0, int64_t rows) { kern.rows_forward(xp + r0 * l.c, yp + r0 * l.c, rows, l.c, alpha, beta); },
          [](int64_t) {});
    } else {
      const BnSiluKernels& kern = bn_silu_kernels();
      const float* xp = x.data_ptr<float>();
      float* yp = y.data_ptr<float>();
      for_each_part(
          l, [&](int64_t r0, int64_t rows) { kern.rows_forward(xp + r0 * l.c, yp + r0 * l.c, rows, l.c, alpha, beta); },
          [&](int64_t p) { kern.plane_forward(xp + p * l.s, yp + p * l.s, l.s, alpha[p % l.c], beta[p % l.c]); });
    }
    ctx->save_for_backward({x, weight, bias, mean, invstd});
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor& x = saved[0];
    const torch::Tensor& weight = saved[1];
    const torch::Tensor& mean = saved[3];
    const torch::Tensor& invstd = saved[4];
    const Layout l = layout_of(x);
    const bool bf16 = x.scalar_type() == torch::kBFloat16;
    const torch::Tensor gy = dense(grads[0].to(x.scalar_type()), l);
    const Coefficients k = coefficients(weight, saved[2], mean, invstd);
    const float* alpha = k.alpha.data();
    const float* beta = k.beta.data();
    const float* mp = floats(mean);
    const BnSiluKernels& kern = bn_silu_kernels();
    const BnSiluBf16Kernels* kern16 = bf16 ? bn_silu_bf16_kernels() : nullptr;
    // bfloat16: the gradient at the BN output, kept in float by the first pass for the second
    torch::Tensor g_bn_buffer = bf16 ? torch::empty({x.numel()}, torch::kFloat) : torch::Tensor();
    float* g_bn = bf16 ? g_bn_buffer.data_ptr<float>() : nullptr;
    auto [sum_g, sum_gx] = channel_sums(
        l,
        [&](int64_t r0, int64_t rows, double* a, double* b) {
          const int64_t at = r0 * l.c;
          if (bf16) {
            kern16->rows_backward_sums(bf16_bits(x) + at, bf16_bits(gy) + at, rows, l.c, alpha, beta, mp, a, b,
                                       g_bn + at);
          } else {
            kern.rows_backward_sums(x.data_ptr<float>() + at, gy.data_ptr<float>() + at, rows, l.c, alpha, beta, mp, a,
                                    b);
          }
        },
        [&](int64_t p, double* a, double* b) {
          const int64_t ch = p % l.c;
          kern.plane_backward_sums(x.data_ptr<float>() + p * l.s, gy.data_ptr<float>() + p * l.s, l.s, alpha[ch],
                                   beta[ch], mp[ch], a, b);
        });
    const auto count = static_cast<double>(l.n * l.s);
    // As ATen's batch norm backward: gx = (g - (x - mean) * dot * invstd² / n - Σg / n) * invstd * w, each product
    // rounded to float as the tensor ops did.
    const float* is = floats(invstd);
    std::vector<float> proj(static_cast<size_t>(l.c)), grad_mean(proj.size()), grad_weight(proj.size()),
        grad_bias(proj.size());
    for (int64_t ch = 0; ch < l.c; ++ch) {
      const auto dot = static_cast<float>(sum_gx[ch]);
      const float dot_invstd = dot * is[ch];
      proj[ch] = dot_invstd * is[ch] / static_cast<float>(count);
      grad_mean[ch] = static_cast<float>(sum_g[ch] / count);
      grad_weight[ch] = dot_invstd;
      grad_bias[ch] = static_cast<float>(sum_g[ch]);
    }
    torch::Tensor gx = torch::empty_like(x);
    const float* pp = proj.data();
    const float* gm = grad_mean.data();
    const float* sc = alpha;  // invstd * w
    if (bf16) {
      for_each_part(
          l,
          [&](int64_t r0, int64_t rows) {
            const int64_t at = r0 * l.c;
            kern16->rows_backward_input(bf16_bits(x) + at, g_bn + at, bf16_bits(gx) + at, rows, l.c, mp, pp, gm, sc);
          },
          [](int64_t) {});
    } else {
      const float* xp = x.data_ptr<float>();
      const float* gp = gy.data_ptr<float>();
      float* out = gx.data_ptr<float>();
      for_each_part(
          l,
          [&](int64_t r0, int64_t rows) {
            kern.rows_backward_input(xp + r0 * l.c, gp + r0 * l.c, out + r0 * l.c, rows, l.c, alpha, beta, mp, pp, gm,
                                     sc);
          },
          [&](int64_t p) {
            const int64_t ch = p % l.c;
            kern.plane_backward_input(xp + p * l.s, gp + p * l.s, out + p * l.s, l.s, alpha[ch], beta[ch], mp[ch],
                                      pp[ch], gm[ch], sc[ch]);
          });
    }
    return {gx, float_tensor(grad_weight), float_tensor(grad_bias), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

const BnSiluKernels& bn_silu_kernels() {
  static const BnSiluKernels& chosen = [&]() -> const BnSiluKernels& {
#if defined(__x86_64__) && defined(__GNUC__)
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512bw")) {
      return bn_silu_kernels_avx512();
    }
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return bn_silu_kernels_avx2();
#endif
    return bn_silu_kernels_base();
  }();
  return chosen;
}

const BnSiluBf16Kernels* bn_silu_bf16_kernels() {
#if defined(__x86_64__) && defined(__GNUC__)
  static const BnSiluBf16Kernels* chosen =
      __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512bf16")
          ? &bn_silu_bf16_kernels_avx512()
          : nullptr;
  return chosen;
#else
  return nullptr;
#endif
}

// Measured with train_step_bench fusion=both (yolov8n, channels-last, 2 threads): the AVX-512 loops took 8% off
// the step's CPU time at 640 px on an AMD Zen 4 (even at 160); the AVX2 loops made it slower on an AMD Zen 1 (wall
// 667 against 556 ms at 160 px batch 16, 5.55 against 5.15 s at 640 px batch 8), so there ATen's ops stay.
namespace {
bool fusion_pays_here() {
  static const bool pays = &bn_silu_kernels() == &bn_silu_kernels_avx512();
  return pays;
}
}  // namespace

void set_batch_norm_silu_fusion(bool enabled) { g_fusion.store(enabled ? 1 : 0); }
bool batch_norm_silu_fusion() {
  const int setting = g_fusion.load();
  return setting < 0 ? fusion_pays_here() : setting == 1;
}

bool batch_norm_silu_supported(const torch::Tensor& x) {
  if (!x.defined() || x.dim() != 4 || !x.device().is_cpu() || x.numel() == 0) return false;
  if (x.scalar_type() == torch::kFloat) return true;
  return x.scalar_type() == torch::kBFloat16 && bn_silu_bf16_kernels() != nullptr && x.size(1) % 16 == 0 &&
         x.is_contiguous(torch::MemoryFormat::ChannelsLast);
}

torch::Tensor batch_norm_silu_train(const torch::Tensor& x_in, const torch::Tensor& weight, const torch::Tensor& bias,
                                    torch::Tensor& running_mean, torch::Tensor& running_var, double momentum,
                                    double eps) {
  TORCH_CHECK(batch_norm_silu_supported(x_in),
              "batch_norm_silu_train: x must be a 4-D CPU float32 tensor, or bfloat16 in channels-last memory with a "
              "multiple of 16 channels on a CPU with AVX512-BF16");
  const bool channels_last = !x_in.is_contiguous() && x_in.is_contiguous(torch::MemoryFormat::ChannelsLast);
  const torch::Tensor x = x_in.is_contiguous() || channels_last ? x_in : x_in.contiguous();
  const bool bf16 = x.scalar_type() == torch::kBFloat16;
  const Layout l = layout_of(x);
  TORCH_CHECK(weight.numel() == l.c && bias.numel() == l.c && running_mean.numel() == l.c && running_var.numel() == l.c,
              "batch_norm_silu_train: weight, bias and running statistics must have ", l.c, " values");
  TORCH_CHECK(weight.scalar_type() == torch::kFloat && bias.scalar_type() == torch::kFloat && weight.is_contiguous() &&
                  bias.is_contiguous(),
              "batch_norm_silu_train: weight and bias must be contiguous float32");
  const int64_t count = l.n * l.s;
  TORCH_CHECK(count > 1, "batch_norm_silu_train: expected more than 1 value per channel when training");
  torch::Tensor mean, invstd;
  {
    torch::NoGradGuard no_grad;
    const torch::Tensor xd = x.detach();
    const BnSiluKernels& kern = bn_silu_kernels();
    auto [sum, sq] = channel_sums(
        l,
        [&](int64_t r0, int64_t rows, double* a, double* b) {
          if (bf16) {
            bn_silu_bf16_kernels()->rows_stats(bf16_bits(xd) + r0 * l.c, rows, l.c, a, b);
          } else {
            kern.rows_stats(xd.data_ptr<float>() + r0 * l.c, rows, l.c, a, b);
          }
        },
        [&](int64_t p, double* a, double* b) { kern.plane_stats(xd.data_ptr<float>() + p * l.s, l.s, a, b); });
    std::vector<float> m(static_cast<size_t>(l.c)), is(m.size()), unbiased(m.size());
    for (int64_t k = 0; k < l.c; ++k) {
      const double mu = sum[k] / static_cast<double>(count);
      const double var = std::max(0.0, sq[k] / static_cast<double>(count) - mu * mu);
      m[k] = static_cast<float>(mu);
      is[k] = static_cast<float>(1.0 / std::sqrt(var + eps));
      unbiased[k] = static_cast<float>(var * static_cast<double>(count) / static_cast<double>(count - 1));
    }
    mean = float_tensor(m);
    invstd = float_tensor(is);
    const torch::Tensor var_u = torch::from_blob(unbiased.data(), {l.c}, torch::kFloat);
    running_mean.mul_(1.0 - momentum).add_(mean.to(running_mean.scalar_type()), momentum);
    running_var.mul_(1.0 - momentum).add_(var_u.to(running_var.scalar_type()), momentum);
  }
  return BatchNormSilu::apply(x, weight, bias, mean, invstd);
}

}  // namespace yolo8
