#include "trainer/app/run_dir.h"

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

TEST(RunDir, IncrementsUnlessExistOk) {
  const fs::path project = fresh_dir("runs_inc");
  EXPECT_EQ(make_run_dir(project, "train", "exp", false), project / "train" / "exp");
  EXPECT_EQ(make_run_dir(project, "train", "exp", false), project / "train" / "exp2");
  EXPECT_EQ(make_run_dir(project, "train", "exp", false), project / "train" / "exp3");
  EXPECT_EQ(make_run_dir(project, "train", "exp", true), project / "train" / "exp");
  EXPECT_EQ(make_run_dir(project, "val", "", false), project / "val" / "val");
  EXPECT_TRUE(fs::is_directory(project / "train" / "exp2" / "weights"));
}

TEST(RunDir, LatestLastCheckpointIsTheNewest) {
  const fs::path project = fresh_dir("runs_latest");
  EXPECT_TRUE(latest_last_checkpoint(project, "train").empty());
  for (const char* name : {"a", "b"}) {
    const fs::path dir = make_run_dir(project, "train", name, false);
    std::ofstream(dir / "weights" / "last.pt") << name;
    fs::last_write_time(dir / "weights" / "last.pt",
                        fs::file_time_type::clock::now() + std::chrono::seconds(name[0] == 'a' ? 10 : 0));
  }
  EXPECT_EQ(latest_last_checkpoint(project, "train"), project / "train" / "a" / "weights" / "last.pt");
}

TEST(ResultsCsv, HeaderRowsAndTruncation) {
  const fs::path path = fresh_dir("results_csv");
  fs::create_directories(path);
  ResultsCsv csv(path / "results.csv");
  std::vector<double> row(ResultsCsv::columns().size(), 0.5);
  for (int epoch = 1; epoch <= 3; ++epoch) {
    row[0] = epoch;
    csv.append(row);
  }
  EXPECT_THROW(csv.append({1.0}), std::logic_error);
  csv.keep_epochs_up_to(2);
  std::ifstream in(path / "results.csv");
  std::string header, line;
  std::getline(in, header);
  EXPECT_NE(header.find("metrics/mAP50-95(B)"), std::string::npos);
  int rows = 0;
  while (std::getline(in, line)) ++rows;
  EXPECT_EQ(rows, 2);
}

}  // namespace
}  // namespace yolo8
