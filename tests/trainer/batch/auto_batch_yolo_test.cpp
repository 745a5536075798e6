// batch=auto on the real models: for yolov8n and yolov8s at two image sizes, the chosen batch's measured peak
// (training step with optimizer and EMA, and validation at twice the batch) stays within the budget and uses
// at least 80 % of it. CPU, instrumented allocator.
#include <gtest/gtest.h>

#include "trainer/batch/batch_size.h"
#include "trainer/core/memory_meter.h"
#include "trainer/core/synthetic_step.h"

namespace yolo8 {
namespace {

struct Case {
  const char* model;
  int imgsz;
  int target_batch;  // the budget is set so that about this batch fits
};

class AutoBatchYolo : public ::testing::TestWithParam<Case> {};

TEST_P(AutoBatchYolo, ChosenBatchUsesEightyToHundredPercentOfTheBudget) {
  const Case c = GetParam();
  torch::set_num_threads(1);
  const ModelConfig config = load_model_config(c.model, 4);
  Settings settings;
  settings.loader.imgsz = c.imgsz;
  settings.batch = -1;
  // Budget from a measured step at the target batch, so the test does not hard-code machine figures.
  MemoryMeter meter(torch::kCPU);
  int64_t reference_peak = 0;
  {
    SyntheticStepRunner runner(config, c.imgsz, 8, torch::kCPU, true);
    runner.train_step(c.target_batch);
    reference_peak = measure_peak_bytes(meter, [&] { runner.train_step(c.target_batch); });
  }
  const double budget = static_cast<double>(reference_peak) / 0.9;
  const AutoBatchResult result = auto_batch_for(config, settings, torch::kCPU, budget, 64);
  std::printf("%s imgsz %d: budget %.3f GiB, batch %d, measured peak %.3f GiB (%.0f%%)\n", c.model, c.imgsz,
              budget / kBytesPerGib, result.batch, result.measured_peak_bytes / kBytesPerGib,
              100.0 * result.measured_peak_bytes / budget);
  EXPECT_GE(result.batch, 1);
  EXPECT_LE(static_cast<double>(result.measured_peak_bytes), budget);
  EXPECT_GE(static_cast<double>(result.measured_peak_bytes), 0.8 * budget);
  EXPECT_EQ(result.accumulate, std::max(1, static_cast<int>(std::lround(64.0 / result.batch))));
}

INSTANTIATE_TEST_SUITE_P(NAndSAtTwoSizes, AutoBatchYolo,
                         ::testing::Values(Case{"yolov8n.yaml", 64, 12}, Case{"yolov8n.yaml", 128, 6},
                                           Case{"yolov8s.yaml", 64, 8}, Case{"yolov8s.yaml", 128, 4}));

}  // namespace
}  // namespace yolo8
