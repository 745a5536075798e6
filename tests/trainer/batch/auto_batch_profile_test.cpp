// `yolo8 profile variants=n,s batch=auto gpu_mem=G`: the command a GPU check runs per variant, here on the CPU's
// instrumented allocator. Each variant gets a batch whose confirmed peak (more steps and a validation at twice
// the batch) is within the budget and uses at least 80 % of it, with no out-of-memory error after sizing.
#include <sys/wait.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "common/exit_codes.h"
#include "tests/trainer/process_util.h"

namespace yolo8 {
namespace {
namespace fs = std::filesystem;

TEST(ProfileAutoBatch, EveryVariantFitsItsBudgetWithoutOutOfMemory) {
  const fs::path project = fs::path(::testing::TempDir()) / ("yolo8_profile_auto_" + std::to_string(getpid()));
  fs::remove_all(project);
  const pid_t child = test::spawn_yolo8({"profile", "variants=n,s", "imgsz=64", "batch=auto", "gpu_mem=0.25",
                                         "threads=1", "project=" + project.string(), "name=p"});
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_EQ(test::exit_code_of(status), kExitCompleted);
  std::ifstream in(project / "p" / "auto_batch.json");
  ASSERT_TRUE(in.good());
  const nlohmann::json report = nlohmann::json::parse(in);
  EXPECT_EQ(report["device"], "cpu");
  ASSERT_EQ(report["rows"].size(), 2u);
  int previous_batch = 1 << 30;
  for (const auto& row : report["rows"]) {
    SCOPED_TRACE(row["variant"].get<std::string>());
    ASSERT_TRUE(row["fits"].get<bool>());
    const double budget = row["budget_gib"].get<double>();
    const double confirmed = row["confirmed_peak_gib"].get<double>();
    EXPECT_NEAR(budget, 0.25, 1e-9);
    EXPECT_LE(confirmed, budget);
    EXPECT_GE(confirmed, 0.8 * budget);
    EXPECT_EQ(row["out_of_memory_after"].get<int>(), 0);
    const int batch = row["batch"].get<int>();
    EXPECT_EQ(row["accumulate"].get<int>(), std::max(1, static_cast<int>(std::lround(64.0 / batch))));
    EXPECT_LT(batch, previous_batch);  // the larger model gets the smaller batch
    previous_batch = batch;
  }
  fs::remove_all(project);
}

TEST(ProfileAutoBatch, ABudgetTooSmallForBatchOneFailsClearly) {
  const fs::path project = fs::path(::testing::TempDir()) / ("yolo8_profile_tiny_" + std::to_string(getpid()));
  const pid_t child = test::spawn_yolo8({"profile", "variants=s", "imgsz=64", "batch=auto", "gpu_mem=0.01", "threads=1",
                                         "project=" + project.string(), "name=p"});
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_EQ(test::exit_code_of(status), kExitFailure);
  std::ifstream in(project / "p" / "auto_batch.json");
  ASSERT_TRUE(in.good());
  const nlohmann::json report = nlohmann::json::parse(in);
  EXPECT_FALSE(report["rows"][0]["fits"].get<bool>());
  fs::remove_all(project);
}

// A profile stopped part-way (its time limit, a bad variant) keeps what it measured: each variant's results are
// written as it finishes, not after the last.
TEST(ProfileVariants, EachVariantIsWrittenAsItFinishes) {
  const fs::path project = fs::path(::testing::TempDir()) / ("yolo8_profile_partial_" + std::to_string(getpid()));
  fs::remove_all(project);
  for (const std::string batch : {"1,2", "auto"}) {
    SCOPED_TRACE(batch);
    std::vector<std::string> args = {"profile",   "variants=n,no-such-model.yaml", "imgsz=64",      "batch=" + batch,
                                     "threads=1", "project=" + project.string(),   "name=" + batch, "exist_ok=true"};
    if (batch == "auto") args.push_back("gpu_mem=0.2");
    const pid_t child = test::spawn_yolo8(args);
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    EXPECT_NE(test::exit_code_of(status), kExitCompleted);
    const fs::path run = project / batch;
    std::ifstream in(run / (batch == "auto" ? "auto_batch.json" : "profile.json"));
    ASSERT_TRUE(in.good());
    const nlohmann::json report = nlohmann::json::parse(in);
    const nlohmann::json& first = batch == "auto" ? report["rows"][0] : report[0];
    EXPECT_EQ(first["variant"].get<std::string>().rfind("yolov8n", 0), 0u) << report.dump();
    if (batch != "auto") {
      std::ifstream table(run / "memory-table.yaml");
      const std::string text((std::istreambuf_iterator<char>(table)), std::istreambuf_iterator<char>());
      EXPECT_NE(text.find("yolov8n:"), std::string::npos) << text;
      EXPECT_FALSE(fs::exists(run / "memory-table.yaml.tmp"));
    }
  }
  fs::remove_all(project);
}

}  // namespace
}  // namespace yolo8
