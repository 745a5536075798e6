#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <iostream>

#include "tests/trainer/memory_test_net.h"
#include "trainer/core/auto_batch.h"
#include "trainer/core/memory_meter.h"

namespace yolo8 {
namespace {

using test::TinyTrainer;

class MemoryProfileTest : public ::testing::Test {
 protected:
  void SetUp() override { torch::set_num_threads(2); }
  void TearDown() override { set_cpu_memory_cap(0); }
};

TEST_F(MemoryProfileTest, PeaksGrowWithBatchAndFitIsLinear) {
  TinyTrainer trainer(64);
  ProfileOptions options;
  options.timed_steps = 2;
  const auto rows = profile_steps(
      trainer.meter, [&](int b) { trainer.step(b); }, {1, 2, 4, 8}, 64, options);
  ASSERT_EQ(rows.size(), 4u);
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_FALSE(rows[i].out_of_memory);
    EXPECT_EQ(rows[i].imgsz, 64);
    EXPECT_GT(rows[i].step_seconds, 0.0);
    EXPECT_NEAR(rows[i].images_per_second, rows[i].batch / rows[i].step_seconds, 1e-6);
    EXPECT_EQ(rows[i].reserved_peak_bytes, rows[i].peak_bytes);
    if (i > 0) {
      EXPECT_GT(rows[i].peak_bytes, rows[i - 1].peak_bytes);
    }
  }
  const MemoryFit fit = fit_profile(rows);
  EXPECT_EQ(fit.reference_imgsz, 64);
  for (const StepProfile& row : rows) {
    EXPECT_NEAR(fit.train_peak_bytes(row.batch, 64), static_cast<double>(row.peak_bytes), 0.05 * row.peak_bytes);
  }
  // The per-image part at 96 px, measured, is close to the (96/64)² scaling of the fit at 64 px.
  TinyTrainer larger(96);
  const auto rows96 = profile_steps(
      larger.meter, [&](int b) { larger.step(b); }, {1, 2, 4, 8}, 96, options);
  const MemoryFit fit96 = fit_profile(rows96);
  std::cout << "per image: 64 px " << fit.train.per_image_bytes << " B, 96 px " << fit96.train.per_image_bytes
            << " B, ratio " << fit96.train.per_image_bytes / fit.train.per_image_bytes << " (pixel ratio 2.25)\n";
  EXPECT_NEAR(fit.train.per_image_bytes * imgsz_scale(96, 64), fit96.train.per_image_bytes,
              0.15 * fit96.train.per_image_bytes);
}

TEST_F(MemoryProfileTest, OutOfMemoryRowStopsTheSweep) {
  TinyTrainer trainer(64);
  const int64_t peak2 = trainer.train_step(2);
  set_cpu_memory_cap(peak2 + peak2 / 10);
  const auto rows = profile_steps(
      trainer.meter, [&](int b) { trainer.step(b); }, {1, 2, 8, 16}, 64);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_FALSE(rows[1].out_of_memory);
  EXPECT_TRUE(rows[2].out_of_memory);
  const std::string table = format_profile_table("tiny", rows);
  EXPECT_NE(table.find("OOM"), std::string::npos);
  EXPECT_NE(table.find("images/s"), std::string::npos);
  const auto json = nlohmann::json::parse(profile_json("tiny", "cpu", rows));
  EXPECT_EQ(json["variant"], "tiny");
  EXPECT_EQ(json["rows"].size(), 3u);
  EXPECT_TRUE(json["rows"][2]["out_of_memory"].get<bool>());
  EXPECT_GT(json["fit"]["per_image_gib"].get<double>(), 0.0);
  EXPECT_EQ(json["fit"]["reference_imgsz"], 64);
}

TEST_F(MemoryProfileTest, BadArgumentsAndForeignErrors) {
  TinyTrainer trainer(32);
  EXPECT_THROW(profile_steps(
                   trainer.meter, [&](int b) { trainer.step(b); }, {0}, 32),
               std::invalid_argument);
  ProfileOptions none;
  none.timed_steps = 0;
  EXPECT_THROW(profile_steps(
                   trainer.meter, [&](int b) { trainer.step(b); }, {1}, 32, none),
               std::invalid_argument);
  EXPECT_THROW(profile_steps(
                   trainer.meter, [](int) { throw std::logic_error("bug"); }, {1}, 32),
               std::logic_error);
  EXPECT_THROW(fit_profile({}), std::invalid_argument);
}

}  // namespace
}  // namespace yolo8
