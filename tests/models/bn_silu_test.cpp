// The fused BatchNorm+SiLU training path equals BatchNorm2d + SiLU: values, gradients, running statistics.
#include "models/bn_silu.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "models/blocks.h"
#include "models/bn_silu_kernels.h"

namespace yolo8 {
namespace {

// Restores the process-wide switch whatever a test does.
struct FusionSetting {
  explicit FusionSetting(bool on) : before(batch_norm_silu_fusion()) { set_batch_norm_silu_fusion(on); }
  ~FusionSetting() { set_batch_norm_silu_fusion(before); }
  bool before;
};

struct Pass {
  torch::Tensor y, gx, gw, gb, running_mean, running_var;
};

// One training step of BN+SiLU on x (upstream gradient g) from the given BN state; fused or ATen's ops.
Pass run(bool fused, const torch::Tensor& x_in, const torch::Tensor& g, const torch::nn::BatchNorm2d& init) {
  torch::nn::BatchNorm2d bn(torch::nn::BatchNorm2dOptions(x_in.size(1)).eps(kBnEps).momentum(kBnMomentum));
  {
    torch::NoGradGuard no_grad;
    bn->weight.copy_(init->weight);
    bn->bias.copy_(init->bias);
    bn->running_mean.copy_(init->running_mean);
    bn->running_var.copy_(init->running_var);
  }
  bn->train();
  torch::Tensor x = x_in.detach().clone(x_in.suggest_memory_format()).requires_grad_(true);
  torch::Tensor y =
      fused ? batch_norm_silu_train(x, bn->weight, bn->bias, bn->running_mean, bn->running_var, kBnMomentum, kBnEps)
            : torch::silu(bn->forward(x));
  (y * g).sum().backward();
  return {y.detach(), x.grad(), bn->weight.grad(), bn->bias.grad(), bn->running_mean.clone(), bn->running_var.clone()};
}

torch::nn::BatchNorm2d random_bn(int64_t c) {
  torch::nn::BatchNorm2d bn(torch::nn::BatchNorm2dOptions(c).eps(kBnEps).momentum(kBnMomentum));
  torch::NoGradGuard no_grad;
  bn->weight.uniform_(0.5, 1.5);
  bn->bias.uniform_(-0.5, 0.5);
  bn->running_mean.uniform_(-0.2, 0.2);
  bn->running_var.uniform_(0.5, 2.0);
  return bn;
}

double rel_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a - b).abs().max() / b.abs().max().clamp_min(1e-12)).item<double>();
}

void expect_matches_unfused(torch::MemoryFormat format, int64_t n, int64_t c, int64_t h, int64_t w) {
  torch::manual_seed(7);
  // An offset mean and a spread that is not 1, so that centring and scaling both matter.
  const torch::Tensor x = (torch::randn({n, c, h, w}) * 2.5 + 1.5).contiguous(format);
  const torch::Tensor g = torch::randn({n, c, h, w}).contiguous(format);
  const auto bn = random_bn(c);
  const Pass ref = run(false, x, g, bn);
  const Pass got = run(true, x, g, bn);
  EXPECT_TRUE(got.y.is_contiguous(format));
  EXPECT_TRUE(got.gx.is_contiguous(format));
  EXPECT_LE(rel_diff(got.y, ref.y), 1e-5);
  EXPECT_LE(rel_diff(got.gx, ref.gx), 1e-4);
  EXPECT_LE(rel_diff(got.gw, ref.gw), 1e-4);
  EXPECT_LE(rel_diff(got.gb, ref.gb), 1e-4);
  EXPECT_LE(rel_diff(got.running_mean, ref.running_mean), 1e-6);
  EXPECT_LE(rel_diff(got.running_var, ref.running_var), 1e-6);
  // The running statistics did move (the comparison above is not between two untouched buffers).
  EXPECT_GT(rel_diff(got.running_var, bn->running_var), 1e-3);
}

// Under bfloat16 autocast the Conv's output is bfloat16: the fused loops read and write bfloat16 and compute in
// float. Against the float32 ops on the same bfloat16 values they are within bfloat16's rounding, and no further
// from them than ATen's own bfloat16 BatchNorm2d + SiLU are.
void expect_bfloat16_within_rounding(int64_t n, int64_t c, int64_t h, int64_t w) {
  torch::manual_seed(11);
  const auto format = torch::MemoryFormat::ChannelsLast;
  const torch::Tensor x = (torch::randn({n, c, h, w}) * 2.5 + 1.5).to(torch::kBFloat16).contiguous(format);
  const torch::Tensor g = torch::randn({n, c, h, w}).to(torch::kBFloat16).contiguous(format);
  ASSERT_TRUE(batch_norm_silu_supported(x));
  const auto bn = random_bn(c);
  const Pass exact = run(false, x.to(torch::kFloat), g.to(torch::kFloat), bn);
  const Pass aten = run(false, x, g, bn);
  const Pass got = run(true, x, g, bn);
  ASSERT_EQ(got.y.scalar_type(), torch::kBFloat16);
  ASSERT_EQ(got.gx.scalar_type(), torch::kBFloat16);
  ASSERT_EQ(got.gw.scalar_type(), torch::kFloat);
  EXPECT_TRUE(got.y.is_contiguous(format));
  EXPECT_TRUE(got.gx.is_contiguous(format));
  constexpr double kRounding = 1.0 / 256;  // bfloat16 keeps 8 significant bits
  const auto err = [&](const torch::Tensor& a, const torch::Tensor& b) { return rel_diff(a.to(torch::kFloat), b); };
  EXPECT_LE(err(got.y, exact.y), kRounding);
  EXPECT_LE(err(got.gx, exact.gx), kRounding);
  EXPECT_LE(err(got.y, exact.y), err(aten.y, exact.y) * 1.01);
  EXPECT_LE(err(got.gx, exact.gx), err(aten.gx, exact.gx) * 1.01);
  // The sums come from the same bfloat16 inputs, kept in float over 16 rows and in double beyond.
  EXPECT_LE(err(got.gw, exact.gw), 1e-4);
  EXPECT_LE(err(got.gb, exact.gb), 1e-4);
  EXPECT_LE(err(got.gw, exact.gw), err(aten.gw, exact.gw) * 1.01);
  EXPECT_LE(rel_diff(got.running_mean, exact.running_mean), 1e-6);
  EXPECT_LE(rel_diff(got.running_var, exact.running_var), 1e-6);
}

TEST(BatchNormSilu, Bfloat16ChannelsLastWithinRounding) {
  if (bn_silu_bf16_kernels() == nullptr) GTEST_SKIP() << "this CPU has no AVX512-BF16";
  expect_bfloat16_within_rounding(4, 32, 13, 11);  // rows not a multiple of the 16-row float sums
  expect_bfloat16_within_rounding(2, 256, 2, 3);
  expect_bfloat16_within_rounding(3, 16, 1, 1);  // 1x1 planes: contiguous and channels-last alike
}

// ATen's ops keep what the loops do not take: contiguous bfloat16, or channels not a multiple of 16.
TEST(BatchNormSilu, Bfloat16OnlyInChannelsLastRowsOfWholeVectors) {
  const torch::Tensor x = torch::randn({2, 32, 4, 4}).to(torch::kBFloat16);
  EXPECT_FALSE(batch_norm_silu_supported(x));
  EXPECT_FALSE(batch_norm_silu_supported(
      torch::randn({2, 24, 4, 4}).to(torch::kBFloat16).contiguous(torch::MemoryFormat::ChannelsLast)));
  EXPECT_EQ(batch_norm_silu_supported(x.contiguous(torch::MemoryFormat::ChannelsLast)),
            bn_silu_bf16_kernels() != nullptr);
}

// The fusion is the default only where its AVX-512 loops run: with AVX2 it was measured slower than ATen's ops.
TEST(BatchNormSilu, OnByDefaultOnlyWithTheAvx512Loops) {
  EXPECT_EQ(batch_norm_silu_fusion(), &bn_silu_kernels() == &bn_silu_kernels_avx512());
  {
    FusionSetting on(true);
    EXPECT_TRUE(batch_norm_silu_fusion());
  }
  {
    FusionSetting off(false);
    EXPECT_FALSE(batch_norm_silu_fusion());
  }
}

TEST(BatchNormSilu, ChannelsLastMatchesBatchNorm2dAndSilu) {
  expect_matches_unfused(torch::MemoryFormat::ChannelsLast, 4, 24, 13, 11);
}

TEST(BatchNormSilu, ContiguousMatchesBatchNorm2dAndSilu) {
  expect_matches_unfused(torch::MemoryFormat::Contiguous, 4, 24, 13, 11);
}

TEST(BatchNormSilu, ManyChannelsFewPixelsMatches) {
  expect_matches_unfused(torch::MemoryFormat::ChannelsLast, 2, 256, 2, 3);
  expect_matches_unfused(torch::MemoryFormat::Contiguous, 2, 256, 2, 3);
}

TEST(BatchNormSilu, LargeActivationsStayFinite) {
  // exp of large arguments: SiLU tends to x above and to 0 below, its gradient to 1 and 0.
  torch::Tensor x = torch::tensor({-200.f, -90.f, -20.f, 0.f, 20.f, 90.f, 200.f, 1.f}).view({1, 1, 2, 4});
  torch::Tensor weight = torch::ones({1}), bias = torch::zeros({1});
  torch::Tensor rm = torch::zeros({1}), rv = torch::ones({1});
  // Identity BN on this batch: feed the statistics back as an affine transform that undoes them.
  const double mean = x.mean().item<double>(), sd = std::sqrt(x.var(false).item<double>() + kBnEps);
  weight.fill_(sd);
  bias.fill_(mean);
  torch::Tensor y = batch_norm_silu_train(x, weight, bias, rm, rv, kBnMomentum, kBnEps);
  EXPECT_TRUE(torch::isfinite(y).all().item<bool>());
  EXPECT_NEAR(y.flatten()[0].item<double>(), 0.0, 1e-3);
  EXPECT_NEAR(y.flatten()[6].item<double>(), 200.0, 1e-2);
  EXPECT_LE(rel_diff(y, torch::silu(x)), 1e-5);
}

TEST(BatchNormSilu, SameBitsForAnyThreadCount) {
  torch::manual_seed(3);
  const torch::Tensor x = torch::randn({8, 32, 20, 20}).contiguous(torch::MemoryFormat::ChannelsLast);
  const torch::Tensor g = torch::randn({8, 32, 20, 20}).contiguous(torch::MemoryFormat::ChannelsLast);
  const auto bn = random_bn(32);
  const int threads = torch::get_num_threads();
  torch::set_num_threads(1);
  const Pass one = run(true, x, g, bn);
  torch::set_num_threads(std::max(2, threads));
  const Pass many = run(true, x, g, bn);
  torch::set_num_threads(threads);
  EXPECT_TRUE(torch::equal(one.y, many.y));
  EXPECT_TRUE(torch::equal(one.gx, many.gx));
  EXPECT_TRUE(torch::equal(one.gw, many.gw));
  EXPECT_TRUE(torch::equal(one.running_var, many.running_var));
}

TEST(BatchNormSilu, ConvBlockTrainsTheSameFusedOrNot) {
  torch::manual_seed(11);
  Conv fused_conv(8, 16, 3, 2);
  Conv plain_conv(8, 16, 3, 2);
  {
    torch::NoGradGuard no_grad;
    auto src = fused_conv->named_parameters();
    for (auto& p : plain_conv->named_parameters()) p.value().copy_(src[p.key()]);
  }
  const torch::Tensor x = torch::randn({4, 8, 16, 16}).contiguous(torch::MemoryFormat::ChannelsLast);
  fused_conv->train();
  plain_conv->train();
  torch::Tensor y_fused, y_plain;
  {
    FusionSetting on(true);
    y_fused = fused_conv->forward(x);
  }
  {
    FusionSetting off(false);
    y_plain = plain_conv->forward(x);
  }
  y_fused.square().sum().backward();
  y_plain.square().sum().backward();
  EXPECT_LE(rel_diff(y_fused, y_plain), 1e-5);
  EXPECT_LE(rel_diff(fused_conv->conv->weight.grad(), plain_conv->conv->weight.grad()), 1e-4);
  EXPECT_LE(rel_diff(fused_conv->bn->weight.grad(), plain_conv->bn->weight.grad()), 1e-4);
  EXPECT_LE(rel_diff(fused_conv->bn->running_var, plain_conv->bn->running_var), 1e-6);
  EXPECT_EQ(fused_conv->bn->num_batches_tracked.item<int64_t>(), 1);
  EXPECT_EQ(plain_conv->bn->num_batches_tracked.item<int64_t>(), 1);
  // The state-dict names are BatchNorm2d's.
  std::vector<std::string> names;
  for (const auto& b : fused_conv->named_buffers()) names.push_back(b.key());
  EXPECT_EQ(names, (std::vector<std::string>{"bn.running_mean", "bn.running_var", "bn.num_batches_tracked"}));
}

TEST(BatchNormSilu, EvalModeUsesRunningStatistics) {
  torch::manual_seed(5);
  Conv conv(4, 4, 1, 1);
  conv->eval();
  const torch::Tensor x = torch::randn({2, 4, 5, 5});
  const torch::Tensor before = conv->bn->running_mean.clone();
  torch::NoGradGuard no_grad;
  const torch::Tensor y = conv->forward(x);
  const torch::Tensor expected = torch::silu(conv->bn->forward(conv->conv->forward(x)));
  EXPECT_TRUE(torch::equal(y, expected));
  EXPECT_TRUE(torch::equal(conv->bn->running_mean, before));
}

}  // namespace
}  // namespace yolo8
