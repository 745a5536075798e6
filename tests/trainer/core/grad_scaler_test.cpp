// The gradient scaler of mixed-precision training: exact unscaling, skipped steps on inf/NaN, the scale's
// back-off and growth, the disabled identity, and its state in checkpoints.
#include "trainer/core/grad_scaler.h"

#include <gtest/gtest.h>

#include <limits>

#include "tests/trainer/tiny_net.h"
#include "trainer/core/checkpoint.h"

namespace yolo8 {
namespace {

std::vector<torch::Tensor> grads_of(test::TinyNet& net) {
  std::vector<torch::Tensor> grads;
  for (const auto& p : net->parameters()) grads.push_back(p.grad().clone());
  return grads;
}

void zero_grads(test::TinyNet& net) {
  for (auto& p : net->parameters()) p.mutable_grad() = torch::Tensor();
}

torch::Tensor tiny_loss(test::TinyNet& net) {
  auto gen = at::detail::createCPUGenerator(7);
  return net->forward(at::randn({2, 3, 6, 6}, gen)).square().sum();
}

// Gradients of a clean step with the given scaler; returns whether the step would be taken.
bool clean_step(GradScaler& scaler, test::TinyNet& net) {
  zero_grads(net);
  scaler.scale(tiny_loss(net)).backward();
  scaler.unscale(net->parameters());
  const bool take = scaler.should_step();
  scaler.update();
  return take;
}

// A step whose gradient of parameter `index` holds `bad` (inf or NaN) in its last element.
bool poisoned_step(GradScaler& scaler, test::TinyNet& net, float bad, size_t index = 0) {
  zero_grads(net);
  scaler.scale(tiny_loss(net)).backward();
  net->parameters().at(index).grad().view(-1)[-1] = bad;
  scaler.unscale(net->parameters());
  const bool take = scaler.should_step();
  scaler.update();
  return take;
}

TEST(GradScaler, ScaledGradientsUnscaleToTheTrueGradients) {
  torch::manual_seed(0);
  test::TinyNet net;
  tiny_loss(net).backward();
  const auto expected = grads_of(net);

  GradScaler scaler;
  EXPECT_EQ(scaler.current_scale(), 65536.0);
  zero_grads(net);
  const torch::Tensor loss = tiny_loss(net);
  const torch::Tensor scaled = scaler.scale(loss);
  EXPECT_DOUBLE_EQ(scaled.item<double>(), loss.item<double>() * 65536.0);
  scaled.backward();
  EXPECT_GT(net->parameters()[0].grad().abs().max().item<double>(),
            1000.0 * expected[0].abs().max().item<double>());  // really scaled before unscale
  scaler.unscale(net->parameters());
  const auto actual = grads_of(net);
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < actual.size(); ++i) {
    EXPECT_TRUE(torch::allclose(actual[i], expected[i], /*rtol=*/1e-6, /*atol=*/1e-9)) << "parameter " << i;
  }
  EXPECT_TRUE(scaler.should_step());
  scaler.update();
  EXPECT_EQ(scaler.state().growth_tracker, 1);
  EXPECT_EQ(scaler.current_scale(), 65536.0);
}

TEST(GradScaler, InfOrNanGradientSkipsTheStepAndHalvesTheScale) {
  torch::manual_seed(0);
  test::TinyNet net;
  GradScaler scaler;
  ASSERT_TRUE(clean_step(scaler, net));
  ASSERT_EQ(scaler.state().growth_tracker, 1);
  EXPECT_FALSE(poisoned_step(scaler, net, std::numeric_limits<float>::infinity()));
  EXPECT_EQ(scaler.current_scale(), 32768.0);
  EXPECT_EQ(scaler.state().growth_tracker, 0);
  EXPECT_FALSE(poisoned_step(scaler, net, std::numeric_limits<float>::quiet_NaN()));
  EXPECT_EQ(scaler.current_scale(), 16384.0);
  EXPECT_FALSE(poisoned_step(scaler, net, -std::numeric_limits<float>::infinity()));
  EXPECT_EQ(scaler.current_scale(), 8192.0);
  EXPECT_FALSE(poisoned_step(scaler, net, std::numeric_limits<float>::quiet_NaN(), net->parameters().size() - 1));
  EXPECT_EQ(scaler.current_scale(), 4096.0);
  EXPECT_TRUE(clean_step(scaler, net));
  EXPECT_EQ(scaler.current_scale(), 4096.0);
}

TEST(GradScaler, GrowsAfterGrowthIntervalCleanSteps) {
  torch::manual_seed(0);
  test::TinyNet net;
  GradScalerConfig config;
  config.init_scale = 1024.0;
  config.growth_interval = 3;
  GradScaler scaler(config);
  clean_step(scaler, net);
  clean_step(scaler, net);
  EXPECT_EQ(scaler.current_scale(), 1024.0);
  EXPECT_EQ(scaler.state().growth_tracker, 2);
  clean_step(scaler, net);
  EXPECT_EQ(scaler.current_scale(), 2048.0);
  EXPECT_EQ(scaler.state().growth_tracker, 0);
  // A non-finite step restarts the count.
  clean_step(scaler, net);
  clean_step(scaler, net);
  poisoned_step(scaler, net, std::numeric_limits<float>::infinity());
  EXPECT_EQ(scaler.current_scale(), 1024.0);
  clean_step(scaler, net);
  clean_step(scaler, net);
  EXPECT_EQ(scaler.current_scale(), 1024.0);
  clean_step(scaler, net);
  EXPECT_EQ(scaler.current_scale(), 2048.0);
}

TEST(GradScaler, DefaultGrowthIntervalIsTwoThousand) {
  torch::manual_seed(0);
  test::TinyNet net;
  GradScaler scaler;
  scaler.restore({65536.0, 1998});
  clean_step(scaler, net);
  EXPECT_EQ(scaler.current_scale(), 65536.0);
  clean_step(scaler, net);
  EXPECT_EQ(scaler.current_scale(), 131072.0);
  EXPECT_EQ(scaler.state().growth_tracker, 0);
}

TEST(GradScaler, DisabledIsTheIdentity) {
  torch::manual_seed(0);
  test::TinyNet net;
  GradScalerConfig config;
  config.enabled = false;
  GradScaler scaler(config);
  const torch::Tensor loss = tiny_loss(net);
  EXPECT_TRUE(scaler.scale(loss).is_same(loss));
  loss.backward();
  const auto before = grads_of(net);
  net->parameters()[0].grad().view(-1)[0] = std::numeric_limits<float>::infinity();
  scaler.unscale(net->parameters());
  scaler.unscale(net->parameters());  // no bookkeeping when disabled
  EXPECT_TRUE(scaler.should_step());
  scaler.update();
  EXPECT_EQ(scaler.current_scale(), 65536.0);
  EXPECT_EQ(scaler.state().growth_tracker, 0);
  for (size_t i = 1; i < before.size(); ++i) EXPECT_TRUE(torch::equal(net->parameters()[i].grad(), before[i]));
}

TEST(GradScaler, MisuseAndBadSettingsThrow) {
  torch::manual_seed(0);
  test::TinyNet net;
  GradScaler scaler;
  EXPECT_THROW(scaler.update(), std::logic_error);
  EXPECT_THROW(scaler.should_step(), std::logic_error);
  tiny_loss(net).backward();
  scaler.unscale(net->parameters());
  EXPECT_THROW(scaler.unscale(net->parameters()), std::logic_error);
  GradScalerConfig bad;
  bad.growth_interval = 0;
  EXPECT_THROW(GradScaler{bad}, std::invalid_argument);
  bad = {};
  bad.backoff_factor = 1.5;
  EXPECT_THROW(GradScaler{bad}, std::invalid_argument);
  bad = {};
  bad.init_scale = 0;
  EXPECT_THROW(GradScaler{bad}, std::invalid_argument);
  EXPECT_THROW(scaler.restore({-1.0, 0}), std::invalid_argument);
  EXPECT_THROW(scaler.restore({2.0, -3}), std::invalid_argument);
}

TEST(GradScaler, StateRoundTripsThroughACheckpoint) {
  torch::manual_seed(0);
  test::TinyNet net;
  CheckpointSources sources;
  sources.model = net.ptr().get();
  CheckpointState state;
  state.has_grad_scaler = true;
  state.grad_scaler = {8192.0, 1234};
  const CheckpointState loaded = decode_checkpoint(encode_checkpoint(state, sources), {});
  EXPECT_TRUE(loaded.has_grad_scaler);
  EXPECT_EQ(loaded.grad_scaler.scale, 8192.0);
  EXPECT_EQ(loaded.grad_scaler.growth_tracker, 1234);
  GradScaler scaler;
  scaler.restore(loaded.grad_scaler);
  EXPECT_EQ(scaler.current_scale(), 8192.0);
  EXPECT_EQ(scaler.state().growth_tracker, 1234);

  // Runs without amp (and files written before the scaler existed) carry no scaler entry and still load.
  CheckpointState plain;
  const std::vector<char> bytes = encode_checkpoint(plain, sources);
  const CheckpointState reloaded = decode_checkpoint(bytes, {});
  EXPECT_FALSE(reloaded.has_grad_scaler);
  const c10::IValue root = torch::pickle_load(bytes);
  EXPECT_FALSE(root.toGenericDict().at("yolo8").toGenericDict().contains("grad_scaler"));
}

}  // namespace
}  // namespace yolo8
