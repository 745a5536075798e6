// The schedule against the reference's per-iteration bookkeeping (tests/fixtures/schedule_cases.json).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <string>

#include "test_paths.h"
#include "tests/trainer/tiny_net.h"
#include "trainer/core/optimizer.h"
#include "trainer/core/schedule.h"

namespace yolo8 {
namespace {

constexpr double kTol = 1e-9;

nlohmann::json load_cases() {
  const std::string path = std::string(test::kFixturesDir) + "/schedule_cases.json";
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  return nlohmann::json::parse(in);
}

void run_case(const nlohmann::json& c, const std::string& expected_optimizer, double expected_lr) {
  const auto& s = c.at("settings");
  OptimSettings settings;
  settings.optimizer = s.at("optimizer").get<std::string>();
  settings.cos_lr = s.at("cos_lr").get<bool>();
  settings.lr0 = s.at("lr0").get<double>();
  settings.lrf = s.at("lrf").get<double>();
  settings.momentum = s.at("momentum").get<double>();
  settings.weight_decay = s.at("weight_decay").get<double>();
  settings.warmup_epochs = s.at("warmup_epochs").get<double>();
  settings.warmup_momentum = s.at("warmup_momentum").get<double>();
  settings.warmup_bias_lr = s.at("warmup_bias_lr").get<double>();
  settings.nbs = s.at("nbs").get<int64_t>();
  RunShape shape;
  shape.dataset_size = s.at("train_images").get<int64_t>();
  shape.batch = s.at("batch").get<int64_t>();
  shape.epochs = s.at("epochs").get<int64_t>();
  shape.nc = s.at("nc").get<int64_t>();
  const int64_t nb = s.at("batches_per_epoch").get<int64_t>();

  torch::manual_seed(0);
  test::TinyNet net;
  auto built = build_optimizer(*net, settings, shape);
  EXPECT_EQ(built.choice.name, expected_optimizer);
  EXPECT_NEAR(built.choice.lr, expected_lr, 1e-12);
  TrainSchedule schedule(settings, built.choice, shape.batch, shape.epochs, nb);
  EXPECT_EQ(schedule.warmup_iterations(), 100);
  auto& opt = *built.optimizer;

  const auto& iters = c.at("iterations");
  ASSERT_EQ(iters.size(), static_cast<size_t>(shape.epochs * nb));
  size_t k = 0;
  for (int64_t epoch = 0; epoch < shape.epochs; ++epoch) {
    for (int64_t i = 0; i < nb; ++i, ++k) {
      const int64_t ni = i + nb * epoch;
      schedule.begin_iteration(opt, epoch, ni);
      test::tiny_backward(net, ni);
      if (schedule.should_step(ni)) {
        opt.step();
        opt.zero_grad();
        schedule.record_step(ni);
      }
      const auto& want = iters[k];
      SCOPED_TRACE(c.at("name").get<std::string>() + " ni=" + std::to_string(ni));
      ASSERT_EQ(want.at("ni").get<int64_t>(), ni);
      ASSERT_EQ(want.at("epoch").get<int64_t>(), epoch);
      for (size_t g = 0; g < 3; ++g) {
        EXPECT_NEAR(group_lr(opt, g), want.at("lr")[g].get<double>(), kTol) << "group " << g;
      }
      EXPECT_NEAR(group_momentum(opt, kDecayGroup), want.at("momentum").get<double>(), kTol);
      EXPECT_EQ(schedule.accumulate(), std::llround(want.at("accumulate").get<double>()));
      EXPECT_EQ(schedule.optimizer_steps(), want.at("optimizer_steps").get<int64_t>());
    }
    schedule.end_epoch(opt);
  }
}

TEST(ScheduleGolden, SgdLinear) {
  const auto cases = load_cases();
  ASSERT_EQ(cases.at("cases").size(), 2u);
  const auto& c = cases.at("cases")[0];
  ASSERT_EQ(c.at("name"), "sgd_linear");
  run_case(c, "SGD", 0.01);
}

TEST(ScheduleGolden, AutoCosine) {
  const auto cases = load_cases();
  const auto& c = cases.at("cases")[1];
  ASSERT_EQ(c.at("name"), "auto_cosine");
  run_case(c, "AdamW", 0.00125);
}

}  // namespace
}  // namespace yolo8
