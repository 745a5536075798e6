// ModelEma: decay ramp, averaging of parameters and float buffers, independence from the live model.
#include "trainer/core/ema.h"

#include <gtest/gtest.h>

#include <cmath>

#include "tests/trainer/tiny_net.h"

namespace yolo8 {
namespace {

TEST(ModelEma, DecayRamp) {
  test::TinyNet net;
  auto ema = ModelEma::clone_of(net.ptr());
  EXPECT_DOUBLE_EQ(ema.decay_at(0), 0.0);
  EXPECT_DOUBLE_EQ(ema.decay_at(2000), 0.9999 * (1.0 - std::exp(-1.0)));
  EXPECT_NEAR(ema.decay_at(1000000), 0.9999, 1e-12);
  EXPECT_EQ(ema.updates(), 0);
}

TEST(ModelEma, AveragesParametersAndBuffers) {
  torch::manual_seed(3);
  test::TinyNet net;
  auto ema = ModelEma::clone_of(net.ptr());
  auto& shadow = dynamic_cast<test::TinyNetImpl&>(ema.module());
  EXPECT_FALSE(shadow.is_training());
  EXPECT_FALSE(shadow.conv->weight.requires_grad());
  EXPECT_NE(shadow.conv->weight.data_ptr(), net->conv->weight.data_ptr());
  EXPECT_TRUE(torch::equal(shadow.conv->weight, net->conv->weight));

  const auto w0 = net->conv->weight.clone();
  const auto rm0 = net->bn->running_mean.clone();
  // A train-mode forward moves the BatchNorm running stats; a manual change moves the weights.
  net->train();
  {
    torch::NoGradGuard g;
    net->forward(torch::randn({4, 3, 6, 6}) + 2.0);
    net->conv->weight.add_(1.0);
  }
  ema.update(*net);
  EXPECT_EQ(ema.updates(), 1);
  const double d = ema.decay_at(1);
  const auto want_w = w0 * d + (1.0 - d) * net->conv->weight;
  const auto want_rm = rm0 * d + (1.0 - d) * net->bn->running_mean;
  EXPECT_TRUE(torch::allclose(shadow.conv->weight, want_w, 1e-6, 1e-7));
  EXPECT_TRUE(torch::allclose(shadow.bn->running_mean, want_rm, 1e-6, 1e-7));
  EXPECT_FALSE(torch::allclose(shadow.bn->running_mean, rm0));
  // The integer counter is not averaged.
  EXPECT_EQ(shadow.bn->num_batches_tracked.item<int64_t>(), 0);

  // Many updates converge to the model.
  for (int i = 0; i < 3000; ++i) ema.update(*net);
  EXPECT_EQ(ema.updates(), 3001);
  EXPECT_TRUE(torch::allclose(shadow.conv->weight, net->conv->weight, 1e-4, 1e-5));
}

TEST(ModelEma, ExplicitCopyAndMismatch) {
  test::TinyNet net;
  test::TinyNet other;
  ModelEma ema(other.ptr(), *net, 0.9999, 2000.0, 7);
  EXPECT_EQ(ema.updates(), 7);
  EXPECT_TRUE(torch::equal(other->fc->weight, net->fc->weight));
  struct Small : torch::nn::Module {
    Small() { register_parameter("w", torch::zeros({2})); }
  };
  EXPECT_THROW(ModelEma(std::make_shared<Small>(), *net), std::invalid_argument);
  EXPECT_THROW(ema.set_updates(-1), std::invalid_argument);
}

}  // namespace
}  // namespace yolo8
