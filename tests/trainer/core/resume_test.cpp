// Interrupt a tiny run mid-accumulation, checkpoint, resume in fresh objects: the end state is bitwise identical.
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <random>

#include "tests/trainer/tiny_net.h"
#include "trainer/core/checkpoint.h"
#include "trainer/core/optimizer.h"
#include "trainer/core/rng_state.h"
#include "trainer/core/schedule.h"

namespace yolo8 {
namespace {

constexpr int64_t kEpochs = 3;
constexpr int64_t kBatch = 4;
constexpr int64_t kBatchesPerEpoch = 8;

struct Engine {
  OptimSettings settings;
  test::TinyNet net{nullptr};
  BuiltOptimizer built;
  std::unique_ptr<ModelEma> ema;
  std::unique_ptr<TrainSchedule> schedule;
  std::mt19937 augment;

  Engine(const std::string& optimizer, int64_t seed) : augment(7) {
    torch::manual_seed(seed);
    net = test::TinyNet();
    net->train();
    settings.optimizer = optimizer;
    built = build_optimizer(*net, settings, RunShape{kBatch * kBatchesPerEpoch, kBatch, kEpochs, 2});
    ema = std::make_unique<ModelEma>(ModelEma::clone_of(net.ptr()));
    schedule = std::make_unique<TrainSchedule>(settings, built.choice, kBatch, kEpochs, kBatchesPerEpoch);
  }

  // Data drawn from the torch default generator and a std engine, like augmentation would.
  void iterate(int64_t epoch, int64_t i) {
    const int64_t ni = i + kBatchesPerEpoch * epoch;
    schedule->begin_iteration(*built.optimizer, epoch, ni);
    const float scale = 1.0f + std::uniform_real_distribution<float>(0.0f, 1.0f)(augment);
    const auto x = torch::randn({kBatch, 3, 6, 6}) * scale;
    net->forward(x).square().mean().backward();
    if (schedule->should_step(ni)) {
      recipe_optimizer_step(*built.optimizer, *net, ema.get());
      schedule->record_step(ni);
    }
    if (i == kBatchesPerEpoch - 1) schedule->end_epoch(*built.optimizer);
  }
};

bool bitwise_equal(const torch::nn::Module& a, const torch::nn::Module& b) {
  const auto ta = state_tensors(a);
  const auto tb = state_tensors(b);
  if (ta.size() != tb.size()) return false;
  for (size_t k = 0; k < ta.size(); ++k) {
    const auto x = ta[k].second.contiguous();
    const auto y = tb[k].second.contiguous();
    if (x.nbytes() != y.nbytes() || std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) != 0) return false;
  }
  return true;
}

class ResumeTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ResumeTest, InterruptedRunEndsBitwiseIdentical) {
  Engine full(GetParam(), 1);
  for (int64_t e = 0; e < kEpochs; ++e) {
    for (int64_t i = 0; i < kBatchesPerEpoch; ++i) full.iterate(e, i);
  }

  const std::string path = (std::filesystem::temp_directory_path() /
                            ("yolo8_resume_" + std::to_string(::getpid()) + "_" + GetParam() + ".pt"))
                               .string();
  {
    Engine first(GetParam(), 1);
    // Stop after the first iteration of epoch 1 that leaves gradients pending.
    int64_t stop_epoch = -1, stop_i = -1;
    for (int64_t e = 0; e < kEpochs && stop_epoch < 0; ++e) {
      for (int64_t i = 0; i < kBatchesPerEpoch; ++i) {
        first.iterate(e, i);
        const int64_t ni = i + kBatchesPerEpoch * e;
        if (e >= 1 && i < kBatchesPerEpoch - 1 && first.schedule->last_opt_step() != ni) {
          stop_epoch = e;
          stop_i = i;
          break;
        }
      }
    }
    ASSERT_GE(stop_epoch, 1) << "no mid-accumulation stop point";
    CheckpointState st;
    st.epoch = stop_epoch;
    st.iteration_in_epoch = stop_i + 1;
    st.global_iteration = stop_i + 1 + kBatchesPerEpoch * stop_epoch;
    st.batch = kBatch;
    st.schedule = first.schedule->state();
    st.rng = capture_torch_rng();
    st.rng.streams["augment"] = engine_state(first.augment);
    save_checkpoint(path, st, {first.net.get(), first.ema.get(), first.built.optimizer.get(), true});
  }

  // A fresh process: other weights and RNG until the checkpoint is loaded.
  Engine resumed(GetParam(), 99);
  resumed.augment.seed(123);
  CheckpointTargets targets;
  targets.model = resumed.net.get();
  targets.ema = resumed.ema.get();
  targets.optimizer = resumed.built.optimizer.get();
  const auto st = load_checkpoint(path, targets);
  resumed.schedule->restore(st.schedule);
  restore_torch_rng(st.rng);
  set_engine_state(resumed.augment, st.rng.streams.at("augment"));
  for (int64_t e = st.epoch; e < kEpochs; ++e) {
    for (int64_t i = e == st.epoch ? st.iteration_in_epoch : 0; i < kBatchesPerEpoch; ++i) resumed.iterate(e, i);
  }
  std::filesystem::remove(path);

  EXPECT_EQ(resumed.schedule->optimizer_steps(), full.schedule->optimizer_steps());
  EXPECT_EQ(resumed.ema->updates(), full.ema->updates());
  EXPECT_GT(full.schedule->optimizer_steps(), 3);
  EXPECT_TRUE(bitwise_equal(*resumed.net, *full.net));
  EXPECT_TRUE(bitwise_equal(resumed.ema->module(), full.ema->module()));
  for (size_t g = 0; g < 3; ++g) EXPECT_EQ(group_lr(*resumed.built.optimizer, g), group_lr(*full.built.optimizer, g));
  // And the comparison can fail: a run from other weights differs.
  Engine other(GetParam(), 2);
  EXPECT_FALSE(bitwise_equal(*other.net, *full.net));
}

INSTANTIATE_TEST_SUITE_P(Optimizers, ResumeTest, ::testing::Values("SGD", "AdamW"));

}  // namespace
}  // namespace yolo8
