// TrainSchedule beyond the golden runs: LR lambdas, restore, and resuming with another batch size.
#include "trainer/core/schedule.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "tests/trainer/tiny_net.h"
#include "trainer/core/optimizer.h"

namespace yolo8 {
namespace {

TEST(Schedule, LrLambdas) {
  OptimSettings s;
  OptimizerChoice c{"SGD", 0.01, 0.937, 0.1};
  TrainSchedule linear(s, c, 16, 100, 10);
  EXPECT_DOUBLE_EQ(linear.lr_factor(0), 1.0);
  EXPECT_DOUBLE_EQ(linear.lr_factor(50), 0.5 * 0.99 + 0.01);
  EXPECT_DOUBLE_EQ(linear.lr_factor(100), 0.01);
  s.cos_lr = true;
  TrainSchedule cosine(s, c, 16, 100, 10);
  EXPECT_DOUBLE_EQ(cosine.lr_factor(0), 1.0);
  EXPECT_NEAR(cosine.lr_factor(50), 0.505, 1e-15);
  EXPECT_NEAR(cosine.lr_factor(100), 0.01, 1e-15);
  // warm-up length: max(round(3 * nb), 100), -1 when disabled
  EXPECT_EQ(cosine.warmup_iterations(), 100);
  EXPECT_EQ(TrainSchedule(s, c, 16, 100, 50).warmup_iterations(), 150);
  s.warmup_epochs = 0;
  EXPECT_EQ(TrainSchedule(s, c, 16, 100, 50).warmup_iterations(), -1);
  EXPECT_THROW(TrainSchedule(s, c, 0, 100, 50), std::invalid_argument);
}

TEST(Schedule, RestoreContinuesIdentically) {
  OptimSettings s;
  s.cos_lr = true;
  const RunShape shape{80, 8, 12, 3};
  const int64_t nb = 10;
  test::TinyNet net_a;
  test::TinyNet net_b;
  auto a = build_optimizer(*net_a, s, shape);
  auto b = build_optimizer(*net_b, s, shape);
  TrainSchedule sa(s, a.choice, shape.batch, shape.epochs, nb);
  auto run = [&](TrainSchedule& sched, torch::optim::Optimizer& opt, int64_t from, int64_t to) {
    for (int64_t ni = from; ni < to; ++ni) {
      const int64_t epoch = ni / nb;
      sched.begin_iteration(opt, epoch, ni);
      if (sched.should_step(ni)) sched.record_step(ni);
      if (ni % nb == nb - 1) sched.end_epoch(opt);
    }
  };
  run(sa, *a.optimizer, 0, 57);
  TrainSchedule sb(s, b.choice, shape.batch, shape.epochs, nb);
  sb.restore(sa.state());
  for (size_t g = 0; g < 3; ++g) {
    set_group_lr(*b.optimizer, g, group_lr(*a.optimizer, g));
    set_group_momentum(*b.optimizer, g, group_momentum(*a.optimizer, g));
  }
  for (int64_t ni = 57; ni < 120; ++ni) {
    run(sa, *a.optimizer, ni, ni + 1);
    run(sb, *b.optimizer, ni, ni + 1);
    ASSERT_EQ(sa.accumulate(), sb.accumulate());
    ASSERT_EQ(sa.optimizer_steps(), sb.optimizer_steps());
    for (size_t g = 0; g < 3; ++g) {
      ASSERT_EQ(group_lr(*a.optimizer, g), group_lr(*b.optimizer, g)) << ni;
      ASSERT_EQ(group_momentum(*a.optimizer, g), group_momentum(*b.optimizer, g)) << ni;
    }
  }
  EXPECT_LT(group_lr(*a.optimizer, 1), 0.01 * 0.2);  // the cosine decay really ran
  ScheduleState bad;
  bad.accumulate = 0;
  EXPECT_THROW(sb.restore(bad), std::invalid_argument);
}

TEST(Schedule, ResumeWithAnotherBatchKeepsNbsAndCounters) {
  OptimSettings s;
  s.optimizer = "SGD";
  s.warmup_epochs = 0;  // accumulate comes straight from the batch plan
  test::TinyNet net;
  auto built = build_optimizer(*net, s, RunShape{1600, 16, 10, 2});
  auto& opt = *built.optimizer;
  TrainSchedule sched(s, built.choice, 16, 10, 100);
  EXPECT_EQ(sched.accumulate(), 4);
  for (int64_t ni = 0; ni < 10; ++ni) {
    sched.begin_iteration(opt, 0, ni);
    if (sched.should_step(ni)) sched.record_step(ni);
  }
  EXPECT_EQ(sched.optimizer_steps(), 2);  // at ni 3 and 7
  EXPECT_EQ(sched.last_opt_step(), 7);
  set_group_lr(opt, 1, 0.0042);

  // 10 batches of 16 = 160 images done; with batch 8 the run continues at iteration 20 of 200 per epoch.
  auto plan = sched.change_batch(opt, 8, 200, 20);
  EXPECT_EQ(plan.accumulate, 8);
  EXPECT_EQ(sched.accumulate(), 8);
  EXPECT_DOUBLE_EQ(plan.weight_decay, 0.0005 * 8 * 8 / 64);
  EXPECT_DOUBLE_EQ(group_weight_decay(opt, kDecayGroup), plan.weight_decay);
  EXPECT_EQ(group_weight_decay(opt, kBiasGroup), 0.0);
  EXPECT_EQ(group_weight_decay(opt, kNormGroup), 0.0);
  EXPECT_EQ(group_lr(opt, 1), 0.0042);  // lr untouched
  EXPECT_EQ(sched.optimizer_steps(), 2);
  EXPECT_EQ(sched.batch(), 8);
  for (int64_t ni = 20; ni < 27; ++ni) EXPECT_FALSE(sched.should_step(ni)) << ni;
  EXPECT_TRUE(sched.should_step(27));

  plan = sched.change_batch(opt, 48, 34, 4);  // round(64 / 48) = 1
  EXPECT_EQ(plan.accumulate, 1);
  EXPECT_DOUBLE_EQ(group_weight_decay(opt, kDecayGroup), 0.0005 * 48 / 64);
  EXPECT_TRUE(sched.should_step(4));
  EXPECT_EQ(sched.optimizer_steps(), 2);
}

TEST(Schedule, ResumeWithAnotherBatchDuringWarmup) {
  OptimSettings s;
  s.optimizer = "SGD";
  test::TinyNet net;
  auto built = build_optimizer(*net, s, RunShape{800, 16, 10, 2});
  TrainSchedule sched(s, built.choice, 16, 10, 50);
  EXPECT_EQ(sched.warmup_iterations(), 150);
  sched.change_batch(*built.optimizer, 32, 25, 25);
  EXPECT_EQ(sched.warmup_iterations(), 100);  // max(round(3 * 25), 100)
  sched.begin_iteration(*built.optimizer, 2, 60);
  EXPECT_EQ(sched.accumulate(), 2);  // round(1 + 0.6 * (2 - 1)) = 2
  sched.begin_iteration(*built.optimizer, 1, 40);
  EXPECT_EQ(sched.accumulate(), 1);  // round(1.4)
  EXPECT_NEAR(group_momentum(*built.optimizer, 1), 0.8 + 0.4 * 0.137, 1e-12);
}

// One optimizer step for both precisions: without a scaler it is the reference's clip_grad_norm_ + step, bit for
// bit; with one it unscales first and skips a step whose gradients hold inf.
std::vector<torch::Tensor> weights_of(test::TinyNet& net) {
  std::vector<torch::Tensor> weights;
  for (const auto& p : net->parameters()) weights.push_back(p.detach().clone());
  return weights;
}

TEST(RecipeOptimizerStep, ClipsBitwiseLikeClipGradNorm) {
  torch::manual_seed(3);
  test::TinyNet reference;
  test::TinyNet net(std::dynamic_pointer_cast<test::TinyNetImpl>(reference->clone()));
  OptimSettings settings;
  settings.optimizer = "SGD";
  const RunShape shape{64, 16, 10, 2};
  BuiltOptimizer ref_opt = build_optimizer(*reference, settings, shape);
  BuiltOptimizer opt = build_optimizer(*net, settings, shape);
  for (int64_t seed = 0; seed < 3; ++seed) {
    test::tiny_backward(reference, seed);
    test::tiny_backward(net, seed);
    torch::nn::utils::clip_grad_norm_(reference->parameters(), 0.05);  // small: the clip acts
    ref_opt.optimizer->step();
    ref_opt.optimizer->zero_grad();
    EXPECT_TRUE(recipe_optimizer_step(*opt.optimizer, *net, nullptr, 0.05));
  }
  const auto a = weights_of(reference);
  const auto b = weights_of(net);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << "parameter " << i;
}

TEST(RecipeOptimizerStep, ScaledStepUnscalesAndSkipsInf) {
  torch::manual_seed(3);
  test::TinyNet plain;
  test::TinyNet scaled(std::dynamic_pointer_cast<test::TinyNetImpl>(plain->clone()));
  OptimSettings settings;
  settings.optimizer = "SGD";
  const RunShape shape{64, 16, 10, 2};
  BuiltOptimizer plain_opt = build_optimizer(*plain, settings, shape);
  BuiltOptimizer scaled_opt = build_optimizer(*scaled, settings, shape);
  ModelEma ema = ModelEma::clone_of(scaled.ptr());
  GradScaler scaler;
  test::tiny_backward(plain, 1);
  EXPECT_TRUE(recipe_optimizer_step(*plain_opt.optimizer, *plain, nullptr));
  auto gen = at::detail::createCPUGenerator(1);
  scaler.scale(scaled->forward(at::randn({2, 3, 6, 6}, gen)).square().sum()).backward();
  EXPECT_TRUE(recipe_optimizer_step(*scaled_opt.optimizer, *scaled, &ema, 10.0, &scaler));
  EXPECT_EQ(ema.updates(), 1);
  const auto a = weights_of(plain);
  const auto b = weights_of(scaled);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::allclose(a[i], b[i], 1e-6, 1e-7)) << "parameter " << i;

  test::tiny_backward(scaled, 2);
  scaled->parameters()[0].grad().view(-1)[0] = std::numeric_limits<float>::infinity();
  EXPECT_FALSE(recipe_optimizer_step(*scaled_opt.optimizer, *scaled, &ema, 10.0, &scaler));
  EXPECT_EQ(ema.updates(), 1);
  EXPECT_EQ(scaler.current_scale(), 65536.0 / 2);
  const auto c = weights_of(scaled);
  for (size_t i = 0; i < b.size(); ++i) EXPECT_TRUE(torch::equal(b[i], c[i])) << "parameter " << i;
  for (const auto& p : scaled->parameters()) {
    EXPECT_FALSE(p.grad().defined() && p.grad().abs().sum().item<double>() != 0) << "gradients are zeroed";
  }
}

}  // namespace
}  // namespace yolo8
