#include "trainer/core/synthetic_step.h"

#include <gtest/gtest.h>

#include "models/model_yaml.h"
#include "trainer/core/auto_batch.h"
#include "trainer/core/memory_meter.h"

namespace yolo8 {
namespace {

SyntheticStepRunner make_runner() {
  return SyntheticStepRunner(load_model_config("yolov8n.yaml", 3), 64, 4, torch::kCPU, false);
}

// A profile times steps, not data making: the batch of a size is made once, on the runner's device, and reused (on a
// GPU each step drew its images on one CPU core and copied them from pageable memory inside the timer).
TEST(SyntheticStep, TheBatchOfASizeIsMadeOnceAndReused) {
  SyntheticStepRunner runner = make_runner();
  const SyntheticBatch& first = runner.batch(6);
  const void* images = first.images.data_ptr();
  EXPECT_EQ(first.images.sizes(), (std::vector<int64_t>{6, 3, 64, 64}));
  EXPECT_EQ(first.images.scalar_type(), torch::kUInt8);
  EXPECT_EQ(first.images.device(), torch::Device(torch::kCPU));
  EXPECT_EQ(runner.batch(6).images.data_ptr(), images);
  runner.train_step(6);
  EXPECT_EQ(runner.batch(6).images.data_ptr(), images);  // the step used the held batch
  EXPECT_EQ(runner.batch(2).images.size(0), 2);
}

TEST(SyntheticStep, EveryImageHasItsLabelsUnderItsOwnIndex) {
  SyntheticStepRunner runner = make_runner();
  const SyntheticBatch& batch = runner.batch(11);  // more images than distinct ones: the rest repeat them
  ASSERT_EQ(batch.labels.size(0), 11 * 4);
  ASSERT_EQ(batch.labels.size(1), 6);
  const torch::Tensor index = batch.labels.select(1, 0);
  for (int64_t i = 0; i < 11; ++i) EXPECT_EQ((index == static_cast<double>(i)).sum().item<int64_t>(), 4) << i;
  const torch::Tensor boxes = batch.labels.slice(1, 2, 6);
  EXPECT_TRUE((boxes > 0).all().item<bool>());
  EXPECT_TRUE((boxes <= 1).all().item<bool>());
  // Image 8 repeats image 0, labels included.
  EXPECT_TRUE(torch::equal(batch.images[8], batch.images[0]));
  EXPECT_TRUE(torch::equal(batch.labels.slice(0, 32, 36).slice(1, 1), batch.labels.slice(0, 0, 4).slice(1, 1)));
  EXPECT_FALSE(torch::equal(batch.images[1], batch.images[0]));
}

// Beside the allocator's figures, a profile row carries the process's memory as the driver counts it and what no
// allocator cap covers (process less reserved): quotad's per-process overhead.
TEST(SyntheticStep, ProfileRowsReportTheProcessMemoryWhereGiven) {
  SyntheticStepRunner runner = make_runner();
  MemoryMeter meter;
  ProfileOptions options;
  options.timed_steps = 1;
  options.process_bytes = [&meter] { return meter.reserved_bytes() + (64 << 20); };  // 64 MiB beyond the cache
  const std::vector<StepProfile> rows = profile_steps(
      meter, [&](int batch) { runner.train_step(batch); }, {1, 2}, 64, options);
  ASSERT_EQ(rows.size(), 2u);
  for (const StepProfile& row : rows) {
    EXPECT_GT(row.process_bytes, 0);
    EXPECT_EQ(row.process_overhead_bytes, 64 << 20);
  }
  options.process_bytes = [] { return int64_t{-1}; };  // unknown: NVML names other PIDs
  const std::vector<StepProfile> unknown = profile_steps(
      meter, [&](int batch) { runner.train_step(batch); }, {1}, 64, options);
  EXPECT_EQ(unknown[0].process_bytes, -1);
  EXPECT_EQ(unknown[0].process_overhead_bytes, -1);
}

}  // namespace
}  // namespace yolo8
