// End-to-end training on a tiny synthetic dataset: run outputs, and that an interrupted and resumed run ends
// bitwise-identical to an uninterrupted one (CPU, deterministic).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "data/synth.h"
#include "trainer/core/checkpoint.h"
#include "trainer/app/model_loading.h"
#include "trainer/app/modes.h"
#include "trainer/core/exit_codes.h"
#include "trainer/core/stop_signal.h"

namespace yolo8 {
namespace {
namespace fs = std::filesystem;

class TrainIntegration : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // ctest runs each test in its own process, in parallel: every process gets its own folder.
    root_ = fs::path(::testing::TempDir()) / ("yolo8_train_integration_" + std::to_string(getpid()));
    fs::remove_all(root_);
    data::synthesize_dataset((root_ / "ds").string(), 16, 4, 64, 3);
  }

  Settings settings(const std::string& name, int epochs) const {
    return resolve_settings({{"data", (root_ / "ds" / "data.yaml").string()},
                             {"model", "yolov8n.yaml"},
                             {"imgsz", "64"},
                             {"batch", "4"},
                             {"epochs", std::to_string(epochs)},
                             {"workers", "2"},
                             {"threads", "1"},
                             {"project", (root_ / "runs").string()},
                             {"name", name},
                             {"exist_ok", "true"},
                             {"verbose", "false"}},
                            "train");
  }

  static std::map<std::string, torch::Tensor> weights_of(const fs::path& checkpoint) {
    LoadedModel loaded = load_any_model(checkpoint.string());
    std::map<std::string, torch::Tensor> weights;
    for (auto& [name, tensor] : state_dict(*loaded.model)) weights[name] = tensor.contiguous();
    return weights;
  }

  static fs::path root_;
};
fs::path TrainIntegration::root_;

TEST_F(TrainIntegration, WritesTheRunFolder) {
  reset_stop_state();
  ASSERT_EQ(run_train(settings("outputs", 1)), kExitCompleted);
  const fs::path run = root_ / "runs" / "train" / "outputs";
  for (const char* file : {"args.yaml", "results.csv", "weights/last.pt", "weights/best.pt"}) {
    EXPECT_TRUE(fs::exists(run / file)) << file;
  }
  std::ifstream csv(run / "results.csv");
  std::string header, row;
  std::getline(csv, header);
  std::getline(csv, row);
  EXPECT_NE(header.find("metrics/mAP50-95(B)"), std::string::npos);
  EXPECT_EQ(std::stoi(row.substr(0, row.find(','))), 1);
  EXPECT_TRUE(is_training_checkpoint((run / "weights" / "last.pt").string()));
}

// Stops inside epoch 2 in the middle of a gradient accumulation, then at an epoch boundary; both resumes
// must land on the uninterrupted run's exact weights.
TEST_F(TrainIntegration, ResumeIsBitwiseIdentical) {
  reset_stop_state();
  ASSERT_EQ(run_train(settings("straight", 2)), kExitCompleted);
  const auto reference = weights_of(root_ / "runs" / "train" / "straight" / "weights" / "last.pt");

  for (const char* stop_at : {"6", "4"}) {
    const std::string name = std::string("interrupted") + stop_at;
    reset_stop_state();
    setenv("YOLO8_TEST_STOP_AT_ITERATION", stop_at, 1);
    const int first = run_train(settings(name, 2));
    unsetenv("YOLO8_TEST_STOP_AT_ITERATION");
    ASSERT_EQ(first, kExitPreempted) << "stop at " << stop_at;
    const fs::path last = root_ / "runs" / "train" / name / "weights" / "last.pt";
    ASSERT_TRUE(checkpoint_readable(last.string()));
    reset_stop_state();
    Settings resume = settings(name, 2);
    resume.resume = "auto";
    ASSERT_EQ(run_train(resume), kExitCompleted);
    const auto resumed = weights_of(last);
    ASSERT_EQ(resumed.size(), reference.size());
    for (const auto& [key, tensor] : reference) {
      ASSERT_TRUE(torch::equal(tensor, resumed.at(key))) << key << " differs after stopping at " << stop_at;
    }
  }
}

// Resuming with another batch keeps the nominal batch: accumulation follows the new batch and the run ends.
TEST_F(TrainIntegration, ResumeWithAnotherBatchContinues) {
  reset_stop_state();
  setenv("YOLO8_TEST_STOP_AT_ITERATION", "3", 1);
  const int first = run_train(settings("rebatch", 2));
  unsetenv("YOLO8_TEST_STOP_AT_ITERATION");
  ASSERT_EQ(first, kExitPreempted);
  const fs::path last = root_ / "runs" / "train" / "rebatch" / "weights" / "last.pt";
  EXPECT_EQ(load_checkpoint(last.string()).batch, 4);
  reset_stop_state();
  Settings resume = settings("rebatch", 2);
  resume.resume = "auto";
  resume.batch = 8;
  ASSERT_EQ(run_train(resume), kExitCompleted);
  const CheckpointState state = load_checkpoint(last.string());
  EXPECT_EQ(state.batch, 8);
  EXPECT_EQ(state.epoch, 2);
  EXPECT_EQ(state.global_iteration, 2 * 2);  // two epochs of 16 images in batches of 8
}

TEST_F(TrainIntegration, MissingDataIsAnInputError) {
  Settings bad = settings("bad", 1);
  bad.data = (root_ / "nope.yaml").string();
  EXPECT_THROW(run_train(bad), DataError);
}

}  // namespace
}  // namespace yolo8
