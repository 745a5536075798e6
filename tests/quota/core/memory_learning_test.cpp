#include "quota/core/memory_learning.h"

#include <gtest/gtest.h>

#include <fstream>

#include "quota/core/policy.h"

namespace yolo8::quota {
namespace {

MemoryObservation seen(const std::string& model, const std::string& device, int imgsz, int batch, double peak) {
  return MemoryObservation{model, device, false, imgsz, batch, peak, ""};
}

// Peaks from runs at several batches and sizes recover fixed + per-image per model and device.
TEST(MemoryLearning, LeastSquaresPerModelAndDevice) {
  std::vector<MemoryObservation> observations;
  for (const int batch : {8, 16, 32, 64}) {
    observations.push_back(seen("yolov8n", "NVIDIA H200", 640, batch, 0.6 + 0.21 * batch));
    observations.push_back(seen("yolov8n", "NVIDIA H200", 320, batch, 0.6 + 0.21 * batch / 4.0));
    observations.push_back(seen("yolov8s", "NVIDIA H200", 640, batch, 1.1 + 0.40 * batch + (batch == 16 ? 0.05 : 0)));
    observations.push_back(seen("yolov8n", "NVIDIA L4", 640, batch, 0.7 + 0.22 * batch));
  }
  const std::vector<ObservedRow> rows = fit_observed(observations);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].device, "NVIDIA H200");
  EXPECT_EQ(rows[0].model, "yolov8n");
  EXPECT_EQ(rows[0].samples, 8);
  EXPECT_NEAR(rows[0].fixed_gib, 0.6, 1e-9);
  EXPECT_NEAR(rows[0].per_image_gib, 0.21, 1e-9);
  EXPECT_EQ(rows[1].model, "yolov8s");
  EXPECT_NEAR(rows[1].fixed_gib, 1.1, 0.05);  // a noisy sample moves the fit a little
  EXPECT_NEAR(rows[1].per_image_gib, 0.40, 0.005);
  EXPECT_EQ(rows[2].device, "NVIDIA L4");
  EXPECT_NEAR(rows[2].per_image_gib, 0.22, 1e-9);
}

// Peaks measured under different LibTorch versions are fitted apart (an upgrade can change the allocator's and
// the kernels' memory); the table's provenance names the version.
TEST(MemoryLearning, LibtorchVersionsAreFittedApartAndNamedInTheProvenance) {
  std::vector<MemoryObservation> observations;
  for (const int batch : {8, 32}) {
    MemoryObservation old_version = seen("yolov8n", "NVIDIA H200", 640, batch, 0.6 + 0.21 * batch);
    old_version.libtorch = "2.1.2";
    MemoryObservation new_version = seen("yolov8n", "NVIDIA H200", 640, batch, 0.5 + 0.18 * batch);
    new_version.libtorch = "2.5.1";
    observations.push_back(old_version);
    observations.push_back(new_version);
  }
  const std::vector<ObservedRow> rows = fit_observed(observations);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].libtorch, "2.1.2");
  EXPECT_NEAR(rows[0].per_image_gib, 0.21, 1e-9);
  EXPECT_EQ(rows[1].libtorch, "2.5.1");
  EXPECT_NEAR(rows[1].per_image_gib, 0.18, 1e-9);
  EXPECT_THROW(observed_table_yaml(rows, "2026-12-01"), std::invalid_argument);  // one version per table
  const std::string text = observed_table_yaml({rows[1]}, "2026-12-01");
  const std::string path = ::testing::TempDir() + "/learned-table-libtorch.yaml";
  std::ofstream(path) << text;
  EXPECT_EQ(load_memory_table(path).provenance.libtorch, "2.5.1") << text;
  // observations from trainers that did not say their version: no version in the provenance
  const std::string unknown = observed_table_yaml(fit_observed({seen("yolov8n", "cpu", 640, 8, 1.0)}), "2026-12-01");
  EXPECT_EQ(unknown.find("libtorch"), std::string::npos) << unknown;
}

// One size only: no slope to fit, so all of it counts per image (an upper bound for larger batches).
TEST(MemoryLearning, OneSizeIsAllPerImage) {
  const auto rows = fit_observed({seen("yolov8n", "cpu", 64, 16, 0.5), seen("yolov8n", "cpu", 64, 16, 0.4)});
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_DOUBLE_EQ(rows[0].fixed_gib, 0);
  EXPECT_NEAR(rows[0].per_image_gib, 0.5 / (16 * 0.01), 1e-9);
}

// The learned table is written in the policy's schema and loads as a policy's memory table.
TEST(MemoryLearning, TableLoadsAsThePolicysMemoryTable) {
  std::vector<MemoryObservation> observations;
  for (const int batch : {8, 32})
    observations.push_back(seen("yolov8n", "NVIDIA H200", 640, batch, 0.6 + 0.21 * batch));
  const std::string text = observed_table_yaml(fit_observed(observations), "2026-11-30");
  const std::string path = ::testing::TempDir() + "/learned-table.yaml";
  std::ofstream(path) << text;
  const MemoryTable table = load_memory_table(path);
  EXPECT_EQ(table.provenance.device, "NVIDIA H200");
  EXPECT_EQ(table.provenance.precision, "float32");
  EXPECT_EQ(table.provenance.date, "2026-11-30");
  EXPECT_NEAR(table.estimate_gib("yolov8n", 640, 16), 0.6 + 0.21 * 16, 1e-5);
  EXPECT_NE(table.source.find("observed"), std::string::npos) << text;
  auto mixed = fit_observed({seen("yolov8n", "a", 640, 8, 1), seen("yolov8n", "b", 640, 8, 1)});
  EXPECT_THROW(observed_table_yaml(mixed, "2026-11-30"), std::invalid_argument);
}

// The per-process overhead `yolo8 profile` measured is not learned from heartbeats: a learned table carries the
// figure it is given, and it loads back; without one the key is left out and the policy's figure applies.
TEST(MemoryLearning, TheProcessOverheadRoundTripsThroughTheTable) {
  const auto rows =
      fit_observed({seen("yolov8n", "NVIDIA H200", 640, 8, 2.3), seen("yolov8n", "NVIDIA H200", 640, 32, 7.3)});
  const std::string path = ::testing::TempDir() + "/learned-table-overhead.yaml";
  const std::string with = observed_table_yaml(rows, "2026-12-01", 0.62);
  std::ofstream(path) << with;
  EXPECT_DOUBLE_EQ(load_memory_table(path).process_overhead_gib, 0.62) << with;
  const std::string without = observed_table_yaml(rows, "2026-12-01");
  EXPECT_EQ(without.find("process_overhead_gib"), std::string::npos) << without;
  std::ofstream(path) << without;
  EXPECT_DOUBLE_EQ(load_memory_table(path).process_overhead_gib, -1);
}

}  // namespace
}  // namespace yolo8::quota
