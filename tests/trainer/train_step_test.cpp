#include "trainer/train_step.h"

#include <gtest/gtest.h>

#include "trainer/memory_meter.h"
#include "trainer/profiler.h"

namespace yolo8 {
namespace {

TrainingCore make_core(int64_t batch) {
  const ModelConfig config = load_model_config("yolov8n.yaml", 3);
  TrainCoreConfig core_config;
  core_config.shape = RunShape{64, batch, 10, 3};
  core_config.batches_per_epoch = 8;
  core_config.optim.optimizer = "SGD";
  core_config.optim.warmup_epochs = 0;
  core_config.optim.nbs = batch;  // an optimizer step every iteration
  torch::manual_seed(0);
  DetectionModel model(config);
  return TrainingCore(model, DetectionModel(config), core_config);
}

TEST(TrainStep, StepsTheOptimizerAndMovesTheWeights) {
  TrainingCore core = make_core(4);
  const SyntheticBatch batch = synthetic_batch(4, 64, 3, 3, 1);
  const torch::Tensor before = core.model()->parameters()[0].clone();
  const StepOutcome outcome = core.step(0, 0, batch.images, batch.labels);
  EXPECT_TRUE(outcome.optimizer_stepped);
  EXPECT_EQ(outcome.loss_items.numel(), 3);
  EXPECT_GT(outcome.loss_items.sum().item<double>(), 0.0);
  EXPECT_FALSE(torch::equal(before, core.model()->parameters()[0]));
  EXPECT_EQ(core.ema().updates(), 1);
}

TEST(TrainStep, DflProjectionStaysFrozen) {
  TrainingCore core = make_core(2);
  for (const auto& item : core.model()->named_parameters()) {
    if (item.key().find(".dfl.") != std::string::npos) EXPECT_FALSE(item.value().requires_grad()) << item.key();
  }
}

TEST(TrainStep, FreezeSettingParsesCountsAndLists) {
  EXPECT_EQ(freeze_layer_indices("3"), (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(freeze_layer_indices("0,5"), (std::vector<int64_t>{0, 5}));
  EXPECT_EQ(freeze_layer_indices("[7]"), (std::vector<int64_t>{7}));
  EXPECT_TRUE(freeze_layer_indices("").empty());
}

// The out-of-memory fallback: two passes of half the batch fit where one full pass does not, and give
// nearly the gradient of the full pass (the loss normalises per pass, so not bitwise).
TEST(TrainStep, ChunkedStepFitsWhereTheFullBatchDoesNot) {
  const SyntheticBatch batch = synthetic_batch(8, 64, 3, 3, 2);
  MemoryMeter meter(torch::kCPU);
  TrainingCore core = make_core(8);
  core.step(0, 0, batch.images, batch.labels);  // creates the optimizer state outside the measurement
  const int64_t full_peak = measure_peak_bytes(meter, [&] { core.step(0, 1, batch.images, batch.labels); });
  const int64_t half_peak = measure_peak_bytes(meter, [&] { core.step(0, 2, batch.images, batch.labels, 2); });
  ASSERT_LT(half_peak, full_peak);
  set_cpu_memory_cap((half_peak + full_peak) / 2);
  EXPECT_THROW(core.step(0, 3, batch.images, batch.labels), OutOfMemory);
  core.optimizer().zero_grad();
  EXPECT_NO_THROW(core.step(0, 3, batch.images, batch.labels, 2));
  set_cpu_memory_cap(0);
}

}  // namespace
}  // namespace yolo8
