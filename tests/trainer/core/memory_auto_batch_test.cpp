#include <gtest/gtest.h>
#include <torch/torch.h>

#include <iostream>
#include <memory>
#include <utility>
#include <vector>

#include "trainer/core/auto_batch.h"
#include "trainer/core/memory_meter.h"
#include "tests/trainer/memory_test_net.h"

namespace yolo8 {
namespace {

using test::TinyTrainer;

class AutoBatchTest : public ::testing::Test {
 protected:
  void SetUp() override { torch::set_num_threads(2); }
  void TearDown() override { set_cpu_memory_cap(0); }
};

void expect_meaningful_choice(const AutoBatchResult& r, double budget) {
  EXPECT_EQ(r.budget_bytes, budget);
  EXPECT_LE(static_cast<double>(r.measured_peak_bytes), budget);
  EXPECT_GE(static_cast<double>(r.measured_peak_bytes), 0.8 * budget)
      << "batch " << r.batch << " uses " << r.measured_peak_bytes << " of " << budget;
  EXPECT_GE(r.batch, 8);
  EXPECT_EQ(r.accumulate, accumulate_for(r.batch, 64));
  EXPECT_GT(r.fit.train.per_image_bytes, 0.0);
  EXPECT_NEAR(r.predicted_peak_bytes, static_cast<double>(r.measured_peak_bytes),
              0.1 * static_cast<double>(r.measured_peak_bytes));
}

TEST_F(AutoBatchTest, ChosenBatchFitsBudgetAtTwoImageSizes) {
  for (const int imgsz : {64, 96}) {
    SCOPED_TRACE("imgsz " + std::to_string(imgsz));
    TinyTrainer trainer(imgsz);
    const int64_t one = trainer.train_step(1);  // also creates the optimizer state
    const double budget = 20.0 * static_cast<double>(one);
    AutoBatchOptions options;
    options.imgsz = imgsz;
    std::vector<std::string> lines;
    options.log = [&](const std::string& line) { lines.push_back(line); };
    const AutoBatchResult r = choose_batch([&](int b) { return trainer.train_step(b); }, budget, options);
    expect_meaningful_choice(r, budget);
    std::cout << "imgsz " << imgsz << ": " << lines.back() << " (" << 100.0 * r.measured_peak_bytes / budget
              << "% of budget)\n";
    EXPECT_GE(r.train_samples.size(), 4u);  // profile plus at least one verification
    EXPECT_FALSE(lines.empty());
    // An independent step at the chosen batch stays inside the budget too.
    EXPECT_LE(static_cast<double>(trainer.train_step(r.batch)), budget);
  }
}

TEST_F(AutoBatchTest, BudgetEnforcedByCapStillChoosesFittingBatch) {
  TinyTrainer trainer(64);
  const int64_t one = trainer.train_step(1);
  const double budget = 20.0 * static_cast<double>(one);
  set_cpu_memory_cap(static_cast<int64_t>(budget));  // a step over budget now fails for real
  const AutoBatchResult r = choose_batch([&](int b) { return trainer.train_step(b); }, budget);
  expect_meaningful_choice(r, budget);
  set_cpu_memory_cap(0);
}

TEST_F(AutoBatchTest, ValidationAtTwiceTheBatchCounts) {
  TinyTrainer trainer(64);
  const int64_t one = trainer.train_step(1);
  const double budget = 20.0 * static_cast<double>(one);
  AutoBatchOptions options;
  options.imgsz = 64;
  options.validation_step = [&](int b) { return trainer.validation_step(b); };
  const AutoBatchResult r = choose_batch([&](int b) { return trainer.train_step(b); }, budget, options);
  ASSERT_FALSE(r.validation_samples.empty());
  EXPECT_EQ(r.validation_samples.front().batch, 2);
  EXPECT_TRUE(r.fit.has_validation);
  EXPECT_LE(static_cast<double>(r.measured_peak_bytes), budget);
  EXPECT_LE(static_cast<double>(trainer.validation_step(2 * r.batch)), budget);
  EXPECT_GE(r.batch, 4);
}

TEST_F(AutoBatchTest, FractionOfBudgetHalvesTheLimit) {
  // Synthetic linear step: 1000 + 100 b bytes.
  auto step = [](int b) { return static_cast<int64_t>(1000 + 100 * b); };
  AutoBatchOptions options;
  options.budget_fraction = parse_batch_spec(0.5).budget_fraction;
  const AutoBatchResult r = choose_batch(step, 6000.0, options);
  EXPECT_EQ(r.budget_bytes, 3000.0);
  EXPECT_EQ(r.batch, 17);  // 1000 + 100 b <= 3000 * 0.9
  EXPECT_EQ(r.measured_peak_bytes, 2700);
  EXPECT_EQ(r.accumulate, 4);
  EXPECT_EQ(r.steps_down, 0);
  const std::string summary = format_auto_batch_summary(r);
  EXPECT_NE(summary.find("batch 17, accumulate 4"), std::string::npos) << summary;
  EXPECT_NE(summary.find("measured peak"), std::string::npos) << summary;
}

TEST_F(AutoBatchTest, InjectedOomDuringVerificationStepsDown) {
  // The model predicts batch 17, but anything above 12 fails.
  int calls = 0;
  auto step = [&](int b) -> int64_t {
    ++calls;
    if (b > 12) {
      throw OutOfMemory("injected at batch " + std::to_string(b));
    }
    return 1000 + 100 * b;
  };
  const AutoBatchResult r = choose_batch(step, 3000.0);
  EXPECT_GE(r.steps_down, 1);
  EXPECT_LE(r.batch, 12);
  EXPECT_GE(r.batch, 8);
  EXPECT_EQ(r.measured_peak_bytes, 1000 + 100 * r.batch);
  EXPECT_LE(calls, 3 + 4);
}

TEST_F(AutoBatchTest, OverBudgetMeasurementStepsDown) {
  // Above batch 12 memory jumps (another algorithm): the verified step exceeds the budget.
  auto step = [](int b) { return static_cast<int64_t>(1000 + 100 * b + (b > 12 ? 2000 : 0)); };
  const AutoBatchResult r = choose_batch(step, 3000.0);
  EXPECT_GE(r.steps_down, 1);
  EXPECT_LE(r.batch, 12);
  EXPECT_LE(r.measured_peak_bytes, 3000);
}

TEST_F(AutoBatchTest, NothingFitsThrowsOutOfMemory) {
  auto step = [](int b) { return static_cast<int64_t>(5000 + 100 * b); };
  EXPECT_THROW(choose_batch(step, 3000.0), OutOfMemory);
  auto oom = [](int b) -> int64_t { throw OutOfMemory("injected at " + std::to_string(b)); };
  EXPECT_THROW(choose_batch(oom, 3000.0), OutOfMemory);
  auto broken = [](int) -> int64_t { throw std::logic_error("not memory"); };
  EXPECT_THROW(choose_batch(broken, 3000.0), std::logic_error);
  EXPECT_THROW(choose_batch(broken, -1.0), std::invalid_argument);
}

TEST_F(AutoBatchTest, InjectedOomHalvesAndSucceeds) {
  std::vector<std::pair<int, int>> halvings;
  std::vector<int> tried;
  const OomFallbackResult r = run_with_oom_fallback(
      32,
      [&](int b) {
        tried.push_back(b);
        if (b > 8) {
          throw OutOfMemory("injected at batch " + std::to_string(b));
        }
      },
      [&](int from, int to, const std::string& error) {
        halvings.emplace_back(from, to);
        EXPECT_NE(error.find("out of memory"), std::string::npos);
      });
  EXPECT_EQ(r.batch, 8);
  EXPECT_EQ(r.halvings, 2);
  EXPECT_EQ(tried, (std::vector<int>{32, 16, 8}));
  EXPECT_EQ(halvings, (std::vector<std::pair<int, int>>{{32, 16}, {16, 8}}));
}

TEST_F(AutoBatchTest, RealOomUnderCapHalvesAndTrains) {
  TinyTrainer trainer(64);
  trainer.train_step(1);
  const int64_t peak8 = trainer.train_step(8);
  set_cpu_memory_cap(peak8 + peak8 / 20);
  OomGuard guard(32, c10::Device(c10::kCPU), [](int, int, const std::string&) {});
  guard.run([&](int b) { trainer.train_step(b); });
  EXPECT_LE(guard.batch(), 8);
  EXPECT_GE(guard.halvings(), 2);
  // The guard keeps the reduced batch for later steps.
  int seen = 0;
  guard.run([&](int b) { seen = b; trainer.train_step(b); });
  EXPECT_EQ(seen, guard.batch());
  set_cpu_memory_cap(0);
}

TEST_F(AutoBatchTest, GuardRethrowsAtBatchOneAndPassesOtherErrors) {
  int calls = 0;
  EXPECT_THROW(run_with_oom_fallback(4, [&](int) { ++calls; throw OutOfMemory("always"); },
                                     [](int, int, const std::string&) {}),
               OutOfMemory);
  EXPECT_EQ(calls, 3);  // 4, 2, 1
  calls = 0;
  EXPECT_THROW(run_with_oom_fallback(4, [&](int) { ++calls; throw std::runtime_error("bad label"); }),
               std::runtime_error);
  EXPECT_EQ(calls, 1);
  EXPECT_THROW(OomGuard(0), std::invalid_argument);
}

TEST(BatchSpecTest, ParsesAllForms) {
  EXPECT_FALSE(parse_batch_spec(16).automatic);
  EXPECT_EQ(parse_batch_spec(16).fixed_batch, 16);
  EXPECT_TRUE(parse_batch_spec(-1).automatic);
  EXPECT_EQ(parse_batch_spec(-1).budget_fraction, 1.0);
  EXPECT_TRUE(parse_batch_spec(0.7).automatic);
  EXPECT_EQ(parse_batch_spec(0.7).budget_fraction, 0.7);
  EXPECT_THROW(parse_batch_spec(0), std::invalid_argument);
  EXPECT_THROW(parse_batch_spec(-2), std::invalid_argument);
  EXPECT_THROW(parse_batch_spec(2.5), std::invalid_argument);
  try {
    parse_batch_spec(-0.5);
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("batch"), std::string::npos);
  }
}

TEST(BatchSpecTest, AccumulateKeepsNominalBatch) {
  EXPECT_EQ(accumulate_for(16), 4);
  EXPECT_EQ(accumulate_for(24), 3);  // 2.67 rounds to 3
  EXPECT_EQ(accumulate_for(64), 1);
  EXPECT_EQ(accumulate_for(200), 1);
  EXPECT_EQ(accumulate_for(1), 64);
  EXPECT_THROW(accumulate_for(0), std::invalid_argument);
}

}  // namespace
}  // namespace yolo8
