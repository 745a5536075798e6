#include "trainer/runtime/run_dir.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <thread>

namespace yolo8 {
namespace {
namespace fs = std::filesystem;

fs::path fresh_dir(const std::string& name) {
  const fs::path dir = fs::path(::testing::TempDir()) / name;
  fs::remove_all(dir);
  return dir;
}

// Ultralytics' layout: project/name, name defaulting to the mode, train2, train3 ... unless exist_ok.
TEST(RunDir, IncrementsUnlessExistOk) {
  const fs::path project = fresh_dir("runs_inc");
  EXPECT_EQ(make_run_dir(project, "train", "", false), project / "train");
  EXPECT_EQ(make_run_dir(project, "train", "", false), project / "train2");
  EXPECT_EQ(make_run_dir(project, "train", "", false), project / "train3");
  EXPECT_EQ(make_run_dir(project, "train", "", true), project / "train");
  EXPECT_EQ(make_run_dir(project, "train", "exp", false), project / "exp");
  EXPECT_EQ(make_run_dir(project, "train", "exp", false), project / "exp2");
  EXPECT_EQ(make_run_dir(project, "val", "", false), project / "val");
  EXPECT_EQ(make_run_dir(project, "predict", "", false), project / "predict");
  EXPECT_EQ(make_run_dir(project, "predict", "", false), project / "predict2");
  EXPECT_EQ(make_run_dir(project, "profile", "", false), project / "profile");
  // Only a train run holds weights.
  EXPECT_TRUE(fs::is_directory(project / "train2" / "weights"));
  EXPECT_TRUE(fs::is_directory(project / "exp2" / "weights"));
  EXPECT_TRUE(fs::is_directory(project / "predict"));
  EXPECT_FALSE(fs::exists(project / "predict" / "weights"));
  EXPECT_FALSE(fs::exists(project / "val" / "weights"));
  EXPECT_FALSE(fs::exists(project / "profile" / "weights"));
}

TEST(RunDir, ProjectDefaultsToRunsSlashTask) {
  EXPECT_EQ(project_dir("", "detect"), fs::path("runs") / "detect");
  EXPECT_EQ(project_dir("/runs", "detect"), fs::path("/runs"));
  EXPECT_EQ(project_dir("experiments", "detect"), fs::path("experiments"));
}

TEST(RunDir, LatestLastCheckpointIsTheNewest) {
  const fs::path project = fresh_dir("runs_latest");
  EXPECT_TRUE(latest_last_checkpoint(project).empty());
  for (const char* name : {"a", "b"}) {
    const fs::path dir = make_run_dir(project, "train", name, false);
    std::ofstream(dir / "weights" / "last.pt") << name;
    fs::last_write_time(dir / "weights" / "last.pt",
                        fs::file_time_type::clock::now() + std::chrono::seconds(name[0] == 'a' ? 10 : 0));
  }
  make_run_dir(project, "predict", "", false);  // other run folders are no candidates
  EXPECT_EQ(latest_last_checkpoint(project), project / "a" / "weights" / "last.pt");
}

TEST(ResultsCsv, HeaderRowsAndTruncation) {
  const fs::path path = fresh_dir("results_csv");
  fs::create_directories(path);
  ResultsCsv csv(path / "results.csv");
  ResultsRow row;
  row.train_box_loss = 0.5;
  for (int epoch = 1; epoch <= 3; ++epoch) {
    row.epoch = epoch;
    csv.append(row);
  }
  csv.keep_epochs_up_to(2);
  std::ifstream in(path / "results.csv");
  std::string header, line;
  std::getline(in, header);
  EXPECT_NE(header.find("metrics/mAP50-95(B)"), std::string::npos);
  int rows = 0;
  while (std::getline(in, line)) ++rows;
  EXPECT_EQ(rows, 2);
}

// The named fields land in the columns the reference (and plots.cpp, and notebooks) read, in the same layout
// as before: epoch right-aligned in 5, every number in 25, 6 significant digits.
TEST(ResultsCsv, RowFieldsLandInTheirColumns) {
  const fs::path path = fresh_dir("results_csv_fields");
  fs::create_directories(path);
  ResultsCsv csv(path / "results.csv");
  ResultsRow row;
  row.epoch = 7;
  row.train_box_loss = 1.0, row.train_cls_loss = 2.0, row.train_dfl_loss = 3.0;
  row.precision = 4.0, row.recall = 5.0, row.map50 = 6.0, row.map50_95 = 7.0;
  row.val_box_loss = 8.0, row.val_cls_loss = 9.0, row.val_dfl_loss = 10.0;
  row.lr_pg0 = 11.0, row.lr_pg1 = 12.0, row.lr_pg2 = 13.0;
  row.time = 14.0, row.gpu_mem_gib = 15.0, row.gpu_hours = 16.0, row.images_per_s = 1234567.0;
  csv.append(row);
  const std::vector<std::string> names = {"epoch",
                                          "train/box_loss",
                                          "train/cls_loss",
                                          "train/dfl_loss",
                                          "metrics/precision(B)",
                                          "metrics/recall(B)",
                                          "metrics/mAP50(B)",
                                          "metrics/mAP50-95(B)",
                                          "val/box_loss",
                                          "val/cls_loss",
                                          "val/dfl_loss",
                                          "lr/pg0",
                                          "lr/pg1",
                                          "lr/pg2",
                                          "time",
                                          "gpu_mem_gib",
                                          "gpu_hours",
                                          "images_per_s"};
  EXPECT_EQ(ResultsCsv::columns(), names);
  const auto pad = [](const std::string& text, size_t width) { return std::string(width - text.size(), ' ') + text; };
  std::string expected_header = "epoch", expected_row = pad("7", 5);
  for (size_t i = 1; i < names.size(); ++i) {
    expected_header += "," + pad(names[i], 25);
    expected_row += "," + pad(i + 1 < names.size() ? std::to_string(i) : "1.23457e+06", 25);
  }
  std::ifstream in(path / "results.csv");
  std::string header, line;
  std::getline(in, header);
  std::getline(in, line);
  EXPECT_EQ(header, expected_header);
  EXPECT_EQ(line, expected_row);
}

}  // namespace
}  // namespace yolo8
