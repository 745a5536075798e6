#include <gtest/gtest.h>
#include <torch/torch.h>

#include <iostream>
#include <memory>
#include <utility>
#include <vector>

#include "tests/trainer/memory_test_net.h"
#include "trainer/core/auto_batch.h"
#include "trainer/core/memory_meter.h"
#include "trainer/core/optimizer.h"

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
  EXPECT_EQ(r.accumulate, plan_batch(OptimSettings{}, r.batch).accumulate);
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

// The trainer's fallback (TrainingCore::guarded_step runs it; train_step_test runs that under a memory cap):
// the batch stays, the passes double.
TEST_F(AutoBatchTest, InjectedOomSplitsIntoMorePassesAndSucceeds) {
  std::vector<std::pair<int64_t, int64_t>> splits;
  std::vector<int64_t> tried;
  int undone = 0;
  OomGuard guard(c10::Device(c10::kCPU), [&](int64_t from, int64_t to, const std::string& error) {
    splits.emplace_back(from, to);
    EXPECT_NE(error.find("out of memory"), std::string::npos);
  });
  const auto step = [&](int64_t passes) {
    tried.push_back(passes);
    if (32 / passes > 8) throw OutOfMemory("injected at " + std::to_string(32 / passes) + " images per pass");
  };
  guard.run(32, step, [&] { ++undone; });
  EXPECT_EQ(guard.passes(), 4);
  EXPECT_EQ(guard.splits(), 2);
  EXPECT_EQ(undone, 2);
  EXPECT_EQ(tried, (std::vector<int64_t>{1, 2, 4}));
  EXPECT_EQ(splits, (std::vector<std::pair<int64_t, int64_t>>{{32, 16}, {16, 8}}));
  // The split is kept for later steps.
  tried.clear();
  guard.run(32, step);
  EXPECT_EQ(tried, (std::vector<int64_t>{4}));
}

TEST_F(AutoBatchTest, GuardRethrowsAtOneImagePerPassAndPassesOtherErrors) {
  int calls = 0;
  OomGuard guard(c10::Device(c10::kCPU), [](int64_t, int64_t, const std::string&) {});
  EXPECT_THROW(guard.run(4,
                         [&](int64_t) {
                           ++calls;
                           throw OutOfMemory("always");
                         }),
               OutOfMemory);
  EXPECT_EQ(calls, 3);  // 4, 2, 1 images per pass
  calls = 0;
  OomGuard other;
  EXPECT_THROW(other.run(4,
                         [&](int64_t) {
                           ++calls;
                           throw std::runtime_error("bad label");
                         }),
               std::runtime_error);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(other.passes(), 1);
  EXPECT_THROW(other.run(0, [](int64_t) {}), std::invalid_argument);
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

// The summary's accumulation is the trainer's (plan_batch rounds half to even: nbs 10 at batch 4 is 2, not 3).
TEST(BatchSpecTest, AccumulateIsTheTrainersPlan) {
  AutoBatchOptions options;
  options.nominal_batch = 10;
  options.profile_batches = {1, 2};
  options.max_batch = 4;
  const AutoBatchResult r = choose_batch([](int b) { return static_cast<int64_t>(100 + 10 * b); }, 1e6, options);
  ASSERT_EQ(r.batch, 4);
  OptimSettings settings;
  settings.nbs = 10;
  EXPECT_EQ(r.accumulate, plan_batch(settings, 4).accumulate);
  EXPECT_EQ(r.accumulate, 2);
}

}  // namespace
}  // namespace yolo8
