// How the trainer reads a split (app::load_split): the index with its report, and an input error naming the
// split when no image is usable. (data::make_loader, an unused second entry point, was removed.) The validation
// loop's model input (app::model_input).
#include "trainer/support/mode_support.h"

#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "data/synth.h"

namespace yolo8 {
namespace {
namespace fs = std::filesystem;

// Captures std::cout for the lifetime of the object.
class CoutCapture {
 public:
  CoutCapture() : previous_(std::cout.rdbuf(text_.rdbuf())) {}
  ~CoutCapture() { std::cout.rdbuf(previous_); }
  std::string text() const { return text_.str(); }

 private:
  std::ostringstream text_;
  std::streambuf* previous_;
};

// Pinned (page-locked) batches create a CUDA context: a loader feeding the CPU must not ask for them, even on a
// node whose GPUs are visible (and leased to someone else).
TEST(LoaderConfig, OnlyALoaderFeedingAGpuPinsItsBatches) {
  const Settings settings;
  for (const auto role :
       {app::LoaderRole::kTrain, app::LoaderRole::kTrainingValidation, app::LoaderRole::kValidation}) {
    EXPECT_FALSE(app::loader_config(settings, 16, 32, role, torch::kCPU).pin_memory);
    EXPECT_TRUE(app::loader_config(settings, 16, 32, role, torch::Device(torch::kCUDA, 1)).pin_memory);
  }
}

TEST(LoadSplit, ReadsTheSplitWithItsReport) {
  const fs::path root = fs::path(::testing::TempDir()) / ("yolo8_load_split_" + std::to_string(getpid()));
  fs::remove_all(root);
  data::synthesize_dataset((root / "ds").string(), 6, 10, 64, 1);
  const data::DatasetSpec spec = data::load_data_yaml((root / "ds" / "data.yaml").string());
  Settings settings;
  settings.loader.workers = 1;
  std::string report;
  std::shared_ptr<const data::DatasetIndex> index;
  {
    CoutCapture capture;
    index = app::load_split(spec, "val", settings, /*verbose=*/true);
    report = capture.text();
  }
  EXPECT_EQ(index->records.size(), 10u);
  EXPECT_NE(report.find("val: 10 files, 10 images"), std::string::npos) << report;
  {
    CoutCapture capture;
    app::load_split(spec, "train", settings, /*verbose=*/false);
    EXPECT_EQ(capture.text(), "");
  }
  fs::remove_all(root);
}

TEST(LoadSplit, NoUsableImageIsAnInputErrorNamingTheSplit) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("yolo8_load_split_empty_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir / "images" / "train");
  std::ofstream(dir / "images" / "train" / "a.jpg") << "garbage";
  std::ofstream(dir / "data.yaml") << "train: images/train\nnames: [a]\n";
  const data::DatasetSpec spec = data::load_data_yaml((dir / "data.yaml").string());
  Settings settings;
  settings.loader.workers = 1;
  try {
    CoutCapture quiet;
    app::load_split(spec, "train", settings, true);
    FAIL() << "an empty split was accepted";
  } catch (const DataError& error) {
    EXPECT_NE(std::string(error.what()).find("split 'train'"), std::string::npos) << error.what();
  }
  fs::remove_all(dir);
}

// The model's input from a uint8 batch: the values of the two-step conversion it replaced, bit for bit, in the
// layout asked for.
TEST(ModelInput, SameValuesAsConvertingThenDividingInEitherLayout) {
  torch::manual_seed(0);
  const torch::Tensor images = torch::randint(0, 256, {3, 3, 40, 24}, torch::kUInt8);
  const torch::Tensor expected = images.to(torch::kFloat).div_(255.0);
  const torch::Tensor last = app::model_input(images, torch::kCPU, /*channels_last=*/true);
  EXPECT_TRUE(last.is_contiguous(torch::MemoryFormat::ChannelsLast));
  EXPECT_EQ(last.scalar_type(), torch::kFloat);
  EXPECT_TRUE(torch::equal(last, expected.contiguous(torch::MemoryFormat::ChannelsLast)));
  const torch::Tensor plain = app::model_input(images, torch::kCPU, /*channels_last=*/false);
  EXPECT_TRUE(plain.is_contiguous());
  EXPECT_TRUE(torch::equal(plain, expected));
  EXPECT_EQ(plain[1][2][3][4].item<float>(), images[1][2][3][4].item<uint8_t>() / 255.0f);
}

}  // namespace
}  // namespace yolo8
