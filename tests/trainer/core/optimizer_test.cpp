// Parameter groups, the `auto` rule, nominal-batch scaling and group hyper-parameter access.
#include "trainer/core/optimizer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "tests/trainer/tiny_net.h"
#include "trainer/core/schedule.h"

namespace yolo8 {
namespace {

bool contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

TEST(Optimizer, ParamGroupsFollowOwningModule) {
  test::TinyNet net;
  const auto g = split_param_groups(*net);
  EXPECT_EQ(g.names[kBiasGroup], (std::vector<std::string>{"bn.bias", "fc.bias"}));
  EXPECT_EQ(g.names[kDecayGroup], (std::vector<std::string>{"conv.weight", "fc.weight"}));
  EXPECT_EQ(g.names[kNormGroup], (std::vector<std::string>{"bn.weight"}));
  EXPECT_TRUE(g.params[kNormGroup][0].is_same(net->bn->weight));
  size_t total = 0;
  for (const auto& p : g.params) total += p.size();
  EXPECT_EQ(total, net->parameters().size());
  EXPECT_FALSE(contains(g.names[kDecayGroup], "bn.running_mean"));
}

TEST(Optimizer, BatchPlanKeepsNominalBatch) {
  OptimSettings s;
  auto p = plan_batch(s, 4);
  EXPECT_EQ(p.accumulate, 16);
  EXPECT_DOUBLE_EQ(p.weight_decay, 0.0005);
  p = plan_batch(s, 48);  // round(1.33) = 1
  EXPECT_EQ(p.accumulate, 1);
  EXPECT_DOUBLE_EQ(p.weight_decay, 0.0005 * 48 / 64);
  p = plan_batch(s, 128);  // round(0.5) = 0 -> 1
  EXPECT_EQ(p.accumulate, 1);
  EXPECT_DOUBLE_EQ(p.weight_decay, 0.001);
  p = plan_batch(s, 26);  // round(2.46) = 2
  EXPECT_EQ(p.accumulate, 2);
  s.nbs = 40;
  EXPECT_EQ(plan_batch(s, 16).accumulate, 2);  // round(2.5) = 2, half to even
  EXPECT_THROW(plan_batch(s, 0), std::invalid_argument);
}

TEST(Optimizer, AutoRule) {
  OptimSettings s;
  RunShape shape{16, 4, 30, 4};
  auto c = resolve_optimizer(s, shape);
  EXPECT_EQ(c.name, "AdamW");
  EXPECT_DOUBLE_EQ(c.lr, 0.00125);
  EXPECT_DOUBLE_EQ(c.momentum, 0.9);
  EXPECT_EQ(c.warmup_bias_lr, 0.0);
  shape.nc = 80;
  EXPECT_DOUBLE_EQ(resolve_optimizer(s, shape).lr, 0.000119);  // round(0.01 / 84, 6)
  // ceil(118287 / 64) * 100 = 184900 > 10000
  shape = RunShape{118287, 16, 100, 80};
  c = resolve_optimizer(s, shape);
  EXPECT_EQ(c.name, "SGD");
  EXPECT_DOUBLE_EQ(c.lr, 0.01);
  EXPECT_DOUBLE_EQ(c.momentum, 0.9);
  // exactly 10000 iterations stays AdamW
  shape = RunShape{6400, 16, 100, 4};
  EXPECT_EQ(resolve_optimizer(s, shape).name, "AdamW");
  shape.dataset_size = 6401;
  EXPECT_EQ(resolve_optimizer(s, shape).name, "SGD");
  s.optimizer = "sgd";
  c = resolve_optimizer(s, shape);
  EXPECT_EQ(c.name, "SGD");
  EXPECT_DOUBLE_EQ(c.lr, 0.01);
  EXPECT_DOUBLE_EQ(c.momentum, 0.937);
  EXPECT_DOUBLE_EQ(c.warmup_bias_lr, 0.1);
}

TEST(Optimizer, BuildsThreeGroupsWithDecayOnlyOnWeights) {
  for (const std::string name : {"SGD", "Adam", "AdamW"}) {
    SCOPED_TRACE(name);
    test::TinyNet net;
    OptimSettings s;
    s.optimizer = name;
    auto built = build_optimizer(*net, s, RunShape{100, 8, 10, 4});
    auto& opt = *built.optimizer;
    ASSERT_EQ(opt.param_groups().size(), 3u);
    EXPECT_EQ(built.plan.accumulate, 8);
    EXPECT_EQ(group_weight_decay(opt, kBiasGroup), 0.0);
    EXPECT_DOUBLE_EQ(group_weight_decay(opt, kDecayGroup), 0.0005);
    EXPECT_EQ(group_weight_decay(opt, kNormGroup), 0.0);
    for (size_t g = 0; g < 3; ++g) {
      EXPECT_DOUBLE_EQ(group_lr(opt, g), 0.01);
      EXPECT_DOUBLE_EQ(group_momentum(opt, g), 0.937);
    }
    EXPECT_EQ(has_sgd_momentum(opt), name == "SGD");
    if (name == "SGD") {
      auto& o = static_cast<torch::optim::SGDOptions&>(opt.param_groups()[1].options());
      EXPECT_TRUE(o.nesterov());
    } else if (name == "Adam") {
      EXPECT_NE(dynamic_cast<torch::optim::Adam*>(&opt), nullptr);
    } else {
      EXPECT_NE(dynamic_cast<torch::optim::AdamW*>(&opt), nullptr);
    }
    set_group_momentum(opt, 2, 0.5);
    EXPECT_DOUBLE_EQ(group_momentum(opt, 2), 0.5);
    set_group_lr(opt, 1, 0.25);
    EXPECT_DOUBLE_EQ(group_lr(opt, 1), 0.25);
    EXPECT_THROW(group_lr(opt, 3), std::out_of_range);
    // a real step works with these groups
    test::tiny_backward(net, 1);
    auto before = net->conv->weight.clone();
    opt.step();
    EXPECT_FALSE(torch::equal(before, net->conv->weight));
  }
}

TEST(Optimizer, ResumedChoiceSurvivesAnotherBatch) {
  OptimSettings s;  // auto
  test::TinyNet net;
  const auto first = build_optimizer(*net, s, RunShape{6400, 16, 100, 4});  // 10000 iterations -> AdamW
  ASSERT_EQ(first.choice.name, "AdamW");
  // A changed run shape can flip `auto` (101 epochs -> 10100 iterations -> SGD); the stored choice keeps AdamW.
  ASSERT_EQ(resolve_optimizer(s, RunShape{6400, 16, 101, 4}).name, "SGD");
  const auto resumed = build_optimizer_with(*net, first.choice, plan_batch(s, 128));
  EXPECT_NE(dynamic_cast<torch::optim::AdamW*>(resumed.optimizer.get()), nullptr);
  EXPECT_DOUBLE_EQ(group_lr(*resumed.optimizer, 0), first.choice.lr);
  EXPECT_DOUBLE_EQ(group_weight_decay(*resumed.optimizer, kDecayGroup), 0.001);  // 0.0005 * 128 * 1 / 64
  EXPECT_EQ(resumed.plan.accumulate, 1);
  OptimizerChoice unresolved{"auto", 0.01, 0.9, 0.0};
  EXPECT_THROW(build_optimizer_with(*net, unresolved, plan_batch(s, 16)), std::invalid_argument);
  OptimizerChoice no_momentum{"SGD", 0.01, 0.0, 0.0};
  EXPECT_THROW(build_optimizer_with(*net, no_momentum, plan_batch(s, 16)), std::invalid_argument);
}

TEST(Optimizer, BadSettingsNameTheKey) {
  OptimSettings s;
  s.optimizer = "lion";
  try {
    validate(s);
    FAIL() << "expected a throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("optimizer"), std::string::npos);
  }
  s = OptimSettings{};
  s.lrf = 2.0;
  try {
    validate(s);
    FAIL() << "expected a throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()).rfind("lrf", 0), 0u);
  }
  s = OptimSettings{};
  s.nbs = 0;
  EXPECT_THROW(validate(s), std::invalid_argument);
}

}  // namespace
}  // namespace yolo8
