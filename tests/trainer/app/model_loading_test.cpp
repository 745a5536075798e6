#include "trainer/app/model_loading.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "test_paths.h"
#include "trainer/app/run_dir.h"

namespace yolo8 {
namespace {
namespace fs = std::filesystem;

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
