#include "trainer/support/model_loading.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <system_error>

#include "test_paths.h"
#include "trainer/runtime/run_dir.h"

namespace yolo8 {
namespace {
namespace fs = std::filesystem;

// Which failure `as_input_error` turns into a DataError (exit 2, which the Job templates map to FailJob): only those
// about the input. A transient fault must keep exit 1, which a Job retries.
template <typename Throw>
std::string outcome_of(Throw&& throw_it) {
  try {
    app::as_input_error([&]() -> int {
      throw_it();
      return 0;
    });
  } catch (const DataError&) {
    return "input";
  } catch (const std::exception&) {
    return "kept";
  }
  return "none";
}

TEST(InputErrors, OnlyFailuresOfTheInputBecomeExitTwo) {
  EXPECT_EQ(outcome_of([] { throw std::runtime_error("data.yaml:3: key 'names' missing"); }), "input");
  EXPECT_EQ(outcome_of([] { throw std::invalid_argument("imgsz must be a multiple of 32"); }), "input");
  EXPECT_EQ(outcome_of([] { TORCH_CHECK(false, "PytorchStreamReader failed reading zip archive"); }), "input");
  EXPECT_EQ(outcome_of([] { throw std::bad_alloc(); }), "kept");
  EXPECT_EQ(outcome_of([] { TORCH_CHECK_WITH(OutOfMemoryError, false, "CUDA out of memory. Tried to allocate"); }),
            "kept");
  EXPECT_EQ(outcome_of([] {
              throw c10::AcceleratorError(c10::SourceLocation{__func__, __FILE__, __LINE__}, 700,
                                          "an illegal memory access was encountered");
            }),
            "kept");
  EXPECT_EQ(outcome_of([] { TORCH_CHECK(false, "CUDA error: unspecified launch failure"); }), "kept");
  EXPECT_EQ(outcome_of([] { throw std::system_error(EIO, std::generic_category(), "read images/0001.jpg"); }), "kept");
  EXPECT_EQ(outcome_of([] { throw std::logic_error("export: model.22 is not fused"); }), "kept");
}

// An Ultralytics checkpoint carries its train_args; val and predict read imgsz, data and single_cls from them.
TEST(ModelLoading, UltralyticsTrainArgsAreRead) {
  const auto arguments = training_arguments(std::string(test::kFixturesDir) + "/val_case/yolov8n-val-case.pt");
  EXPECT_EQ(arguments.at("imgsz"), "160");
  EXPECT_EQ(arguments.at("data"), "/tmp/val-case-work/data/data.yaml");  // where the reference trained it
  EXPECT_EQ(arguments.at("single_cls"), "false");
  EXPECT_EQ(arguments.at("task"), "detect");
  EXPECT_EQ(training_arguments(std::string(test::kFixturesDir) + "/yolov8n-shapes.pt").at("imgsz"), "128");
}

TEST(ModelLoading, FilesWithoutTrainingArgumentsGiveNone) {
  EXPECT_TRUE(training_arguments(std::string(test::kFixturesDir) + "/yolov8n-shapes.state_dict.pt").empty());
  EXPECT_TRUE(training_arguments("yolov8n.yaml").empty());
  EXPECT_TRUE(training_arguments("/nonexistent/best.pt").empty());
}

// resume=true looks for the newest */weights/last.pt in the project folder (runs/detect by default) and names
// the folder it searched when there is none.
TEST(ModelLoading, ResumeTrueNamesTheFolderItSearched) {
  const fs::path project = fs::path(::testing::TempDir()) / "resume_true_empty";
  fs::remove_all(project);
  Settings settings;
  settings.resume = "true";
  settings.project = project.string();
  try {
    resolve_resume_checkpoint(settings);
    ADD_FAILURE() << "resume=true found a checkpoint in an empty folder";
  } catch (const SettingsError& error) {
    EXPECT_NE(std::string(error.what()).find("no */weights/last.pt in " + project.string()), std::string::npos)
        << error.what();
  }
  settings.project.clear();
  try {
    resolve_resume_checkpoint(settings);
  } catch (const SettingsError& error) {
    EXPECT_NE(std::string(error.what()).find((fs::path("runs") / "detect").string()), std::string::npos)
        << error.what();
  }
}

// resume=auto continues project/NAME (NAME defaults to train), the folder a fresh run of that name is made in;
// a folder without a resumable checkpoint starts fresh.
TEST(ModelLoading, ResumeAutoLooksInThisNamesFolder) {
  const fs::path project = fs::path(::testing::TempDir()) / "resume_auto";
  fs::remove_all(project);
  Settings settings;
  settings.resume = "auto";
  settings.project = project.string();
  settings.name = "job";
  EXPECT_EQ(resolve_resume_checkpoint(settings), "");
  const fs::path dir = make_run_dir(project, "train", "job", true);
  std::ofstream(dir / "weights" / "last.pt") << "not a checkpoint";
  EXPECT_EQ(resolve_resume_checkpoint(settings), "");  // unreadable: starts fresh
}

}  // namespace
}  // namespace yolo8
