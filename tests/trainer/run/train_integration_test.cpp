// End-to-end training on a tiny synthetic dataset: run outputs, and that an interrupted and resumed run ends
// bitwise-identical to an uninterrupted one (CPU, deterministic).
#include <unistd.h>

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <fstream>
#include <iostream>

#include "common/exit_codes.h"
#include "data/synth.h"
#include "test_paths.h"
#include "trainer/cli/cli.h"
#include "trainer/core/checkpoint.h"
#include "trainer/core/stop_signal.h"
#include "trainer/modes/mode_table.h"
#include "trainer/run/train_run.h"
#include "trainer/support/model_loading.h"

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

// A run stopped as SIGTERM would stop it once `iteration` global iterations are done.
int run_train_stopping_at(const Settings& settings, int64_t iteration) {
  TrainingRunOptions options;
  options.stop_at_iteration = iteration;
  return TrainingRun(settings, options).run();
}

TEST_F(TrainIntegration, WritesTheRunFolder) {
  reset_stop_state();
  ASSERT_EQ(run_train(settings("outputs", 1)), kExitCompleted);
  const fs::path run = root_ / "runs" / "outputs";
  for (const char* file : {"args.yaml", "yolo8_args.yaml", "results.csv", "weights/last.pt", "weights/best.pt",
                           "labels.jpg", "labels_correlogram.jpg"}) {
    EXPECT_TRUE(fs::exists(run / file)) << file;
  }
  // args.yaml is Ultralytics' (its folder as save_dir, none of our keys); yolo8_args.yaml has every setting.
  const YAML::Node args = YAML::LoadFile((run / "args.yaml").string());
  EXPECT_EQ(args["save_dir"].as<std::string>(), run.string());
  EXPECT_EQ(args["name"].as<std::string>(), "outputs");
  EXPECT_FALSE(args["threads"].IsDefined());
  EXPECT_TRUE(args["dropout"].IsDefined());
  EXPECT_EQ(YAML::LoadFile((run / "yolo8_args.yaml").string())["threads"].as<int>(), 1);
  std::ifstream csv(run / "results.csv");
  std::string header, row;
  std::getline(csv, header);
  std::getline(csv, row);
  EXPECT_NE(header.find("metrics/mAP50-95(B)"), std::string::npos);
  EXPECT_EQ(std::stoi(row.substr(0, row.find(','))), 1);
  EXPECT_TRUE(is_training_checkpoint((run / "weights" / "last.pt").string()));
  // `auto` resolved (16 images, batch 4, 1 epoch: AdamW) is stored for a resume to reuse.
  const CheckpointState state = load_checkpoint((run / "weights" / "last.pt").string());
  EXPECT_EQ(state.optimizer_choice.name, "AdamW");
  EXPECT_GT(state.optimizer_choice.lr, 0.0);
  EXPECT_GT(state.optimizer_choice.momentum, 0.0);
}

// A Job pod that died before its first checkpoint left an empty run folder: the restarted pod (resume=auto) trains
// into that folder, where the next restart will look, not into NAME2.
TEST_F(TrainIntegration, ResumeAutoStartsFreshInItsOwnFolder) {
  reset_stop_state();
  fs::create_directories(root_ / "runs" / "early-death" / "weights");
  Settings restarted = settings("early-death", 1);
  restarted.exist_ok = false;
  restarted.resume = "auto";
  ASSERT_EQ(run_train(restarted), kExitCompleted);
  EXPECT_TRUE(fs::exists(root_ / "runs" / "early-death" / "weights" / "last.pt"));
  EXPECT_FALSE(fs::exists(root_ / "runs" / "early-death2"));
}

// Stops inside epoch 2 in the middle of a gradient accumulation, then at an epoch boundary; both resumes
// must land on the uninterrupted run's exact weights.
TEST_F(TrainIntegration, ResumeIsBitwiseIdentical) {
  reset_stop_state();
  ASSERT_EQ(run_train(settings("straight", 2)), kExitCompleted);
  const auto reference = weights_of(root_ / "runs" / "straight" / "weights" / "last.pt");

  for (const int64_t stop_at : {6, 4}) {
    const std::string name = "interrupted" + std::to_string(stop_at);
    reset_stop_state();
    ASSERT_EQ(run_train_stopping_at(settings(name, 2), stop_at), kExitPreempted) << "stop at " << stop_at;
    const fs::path last = root_ / "runs" / name / "weights" / "last.pt";
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
  ASSERT_EQ(run_train_stopping_at(settings("rebatch", 2), 3), kExitPreempted);
  const fs::path last = root_ / "runs" / "rebatch" / "weights" / "last.pt";
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

// `auto` is resolved once: with nbs=1, 16 images and 1000 epochs it picks SGD at batch 1 (16000 iterations) but
// would pick AdamW at batch 2 (8000). The resume at batch 2 must keep SGD, not fail on a mismatched optimizer.
// 1000 epochs do not fit in a test: the run's time limit (restored on resume, long enough for the first run's
// set-up on a loaded machine) ends the resumed run as completed.
TEST_F(TrainIntegration, ResumeWithAnotherBatchKeepsTheAutoOptimizer) {
  Settings first_settings = settings("auto_optimizer", 1000);
  first_settings.batch = 1;
  first_settings.optim.nbs = 1;
  first_settings.val = false;
  first_settings.plots = false;
  first_settings.time = 45.0 / 3600.0;
  reset_stop_state();
  ASSERT_EQ(run_train_stopping_at(first_settings, 2), kExitPreempted);
  const fs::path last = root_ / "runs" / "auto_optimizer" / "weights" / "last.pt";
  const CheckpointState stopped = load_checkpoint(last.string());
  ASSERT_EQ(stopped.optimizer_choice.name, "SGD");
  ASSERT_EQ(stopped.global_iteration, 2);

  reset_stop_state();
  Settings resume = settings("auto_optimizer", 1000);
  resume.resume = "auto";
  resume.batch = 2;
  ASSERT_EQ(run_train(resume), kExitCompleted);
  const CheckpointState resumed = load_checkpoint(last.string());
  EXPECT_EQ(resumed.optimizer_choice.name, "SGD");
  EXPECT_EQ(resumed.optimizer_choice.lr, stopped.optimizer_choice.lr);
  EXPECT_EQ(resumed.batch, 2);
  EXPECT_GE(resumed.global_iteration, 1);  // trained at batch 2 (the epoch restarts after a batch change)
}

// val takes data, imgsz and single_cls from the weights' training run unless they are given, predict its imgsz
// (and imgsz=h,w as height, width); both write into the project folder as the reference lays it out.
TEST_F(TrainIntegration, ValAndPredictFollowTheTrainingRun) {
  reset_stop_state();
  Settings train = settings("for_val", 1);
  train.loader.single_cls = true;
  ASSERT_EQ(run_train(train), kExitCompleted);
  const std::string best = (root_ / "runs" / "for_val" / "weights" / "best.pt").string();
  const std::string project = "project=" + (root_ / "runs").string();
  const auto run_printing = [](const std::vector<std::string>& words, std::string& out) {
    ::testing::internal::CaptureStdout();
    try {
      const int code = run_mode(parse_command_line(words));
      std::cout.flush();
      out = ::testing::internal::GetCapturedStdout();
      return code;
    } catch (const std::exception& error) {
      std::cout.flush();
      out = ::testing::internal::GetCapturedStdout();
      ADD_FAILURE() << words.front() << " threw: " << error.what() << "\n" << out;
      return -1;
    }
  };

  std::string out;
  ASSERT_EQ(run_printing({"val", "model=" + best, "threads=1", "workers=1", "save_json", project}, out),
            kExitCompleted);
  EXPECT_NE(out.find("val: data=" + (root_ / "ds" / "data.yaml").string() +
                     " imgsz=64 single_cls=true from the "
                     "training run of " +
                     best),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("at imgsz 64 "), std::string::npos) << out;
  EXPECT_TRUE(fs::exists(root_ / "runs" / "val" / "predictions.json"));
  EXPECT_FALSE(fs::exists(root_ / "runs" / "val" / "weights"));

  // What the command line gives wins.
  ASSERT_EQ(run_printing({"val", "model=" + best, "threads=1", "workers=1", "imgsz=96", "single_cls=true",
                          "data=" + (root_ / "ds" / "data.yaml").string(), project},
                         out),
            kExitCompleted);
  EXPECT_EQ(out.find("from the training run"), std::string::npos) << out;
  EXPECT_NE(out.find("at imgsz 96 "), std::string::npos) << out;
  EXPECT_TRUE(fs::exists(root_ / "runs" / "val2" / "confusion_matrix.png"));  // every val run has its folder

  // A 282x320 image: 64 from the training run letterboxes it to 64x64; imgsz=64,128 bounds height 64 and width
  // 128, so 64x73 padded to the stride: 64x96.
  const std::string image = std::string(test::kFixturesDir) + "/val_case/images/val/00002.jpg";
  ASSERT_EQ(run_printing({"predict", "model=" + best, "source=" + image, "threads=1", project}, out), kExitCompleted);
  EXPECT_NE(out.find("predict: imgsz=64 from the training run"), std::string::npos) << out;
  EXPECT_NE(out.find("00002.jpg: 64x64 "), std::string::npos) << out;
  EXPECT_TRUE(fs::exists(root_ / "runs" / "predict" / "00002.jpg"));
  ASSERT_EQ(run_printing(
                {"predict", "model=" + best, "source=" + image, "threads=1", "imgsz=64,128", "save_txt", project}, out),
            kExitCompleted);
  EXPECT_NE(out.find("00002.jpg: 64x96 "), std::string::npos) << out;
  EXPECT_TRUE(fs::is_directory(root_ / "runs" / "predict2" / "labels"));
}

TEST_F(TrainIntegration, MissingDataIsAnInputError) {
  Settings bad = settings("bad", 1);
  bad.data = (root_ / "nope.yaml").string();
  EXPECT_THROW(run_train(bad), DataError);
}

}  // namespace
}  // namespace yolo8
