#include "trainer/core/memory_model.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "test_paths.h"

namespace yolo8 {
namespace {

TEST(MemoryModelTest, LeastSquaresRecoversExactLine) {
  const LinearMemory fit = fit_linear_memory({{1, 1300}, {2, 1600}, {4, 2200}});
  EXPECT_NEAR(fit.fixed_bytes, 1000.0, 1e-9);
  EXPECT_NEAR(fit.per_image_bytes, 300.0, 1e-9);
  EXPECT_NEAR(fit.at(10), 4000.0, 1e-9);
}

TEST(MemoryModelTest, NoisySamplesGiveLeastSquaresLine) {
  // Points (1,10) (2,14) (4,20): slope 23/7 by the normal equations.
  const LinearMemory fit = fit_linear_memory({{1, 10}, {2, 14}, {4, 20}});
  EXPECT_NEAR(fit.per_image_bytes, 23.0 / 7.0, 1e-9);
  EXPECT_NEAR(fit.fixed_bytes, 44.0 / 3.0 - (23.0 / 7.0) * (7.0 / 3.0), 1e-9);
}

TEST(MemoryModelTest, PerImageNeverNegative) {
  const LinearMemory fit = fit_linear_memory({{1, 500}, {2, 480}, {4, 470}});
  EXPECT_EQ(fit.per_image_bytes, 0.0);
  EXPECT_EQ(fit.fixed_bytes, 500.0);
}

TEST(MemoryModelTest, SingleBatchCountsAsPerImage) {
  const LinearMemory fit = fit_linear_memory({{2, 800}});
  EXPECT_EQ(fit.fixed_bytes, 0.0);
  EXPECT_EQ(fit.per_image_bytes, 400.0);
  EXPECT_THROW(fit_linear_memory({}), std::invalid_argument);
  EXPECT_THROW(fit_linear_memory({{0, 10}}), std::invalid_argument);
}

TEST(MemoryModelTest, PerImageScalesWithPixelCount) {
  const MemoryFit fit = fit_memory({{1, 1100}, {2, 1200}}, {}, 320);
  EXPECT_DOUBLE_EQ(imgsz_scale(640, 320), 4.0);
  EXPECT_NEAR(fit.train_peak_bytes(3, 320), 1300.0, 1e-9);
  EXPECT_NEAR(fit.train_peak_bytes(3, 640), 1000.0 + 3 * 400.0, 1e-9);
  EXPECT_NEAR(fit.train_peak_bytes(3, 160), 1000.0 + 3 * 25.0, 1e-9);
}

TEST(MemoryModelTest, ValidationAtTwiceTheBatchCanBind) {
  // Training: 1000 + 100 b. Validation (forward only): 1000 + 80 per image at 2b -> 1000 + 160 b.
  const MemoryFit fit = fit_memory({{1, 1100}, {2, 1200}, {4, 1400}}, {{2, 1160}, {4, 1320}, {8, 1640}}, 640);
  ASSERT_TRUE(fit.has_validation);
  EXPECT_NEAR(fit.validation_peak_bytes(4, 640), 1640.0, 1e-9);
  EXPECT_NEAR(fit.predict_peak_bytes(4, 640), 1640.0, 1e-9);
  // Budget 3000 * 0.9 = 2700: training alone allows b = 17, validation limits to b = 10.
  EXPECT_EQ(max_batch_within(fit, 3000.0, 640, 0.9), 10);
  const MemoryFit train_only = fit_memory({{1, 1100}, {2, 1200}, {4, 1400}}, {}, 640);
  EXPECT_EQ(max_batch_within(train_only, 3000.0, 640, 0.9), 17);
}

TEST(MemoryModelTest, MaxBatchEdges) {
  const MemoryFit fit = fit_memory({{1, 1100}, {2, 1200}}, {}, 640);
  EXPECT_EQ(max_batch_within(fit, 1000.0, 640, 0.9), 0);       // not even b = 1
  EXPECT_EQ(max_batch_within(fit, 1e12, 640, 0.9, 256), 256);  // capped
  EXPECT_EQ(max_batch_within(fit, 1250.0, 640, 0.9), 1);       // b = 1 only
  EXPECT_EQ(max_batch_within(fit, 3000.0, 1280, 1.0), 5);      // 1000 + 400 b <= 3000
  EXPECT_THROW(max_batch_within(fit, 0.0, 640), std::invalid_argument);
  EXPECT_THROW(max_batch_within(fit, 3000.0, 640, 1.5), std::invalid_argument);
  const MemoryFit flat = fit_memory({{1, 500}, {2, 500}}, {}, 640);
  EXPECT_EQ(max_batch_within(flat, 1000.0, 640, 0.9, 64), 64);
}

std::string temp_path(const std::string& name) { return std::string(yolo8::test::kBinaryDir) + "/" + name; }

TEST(MemoryTableTest, RoundTrip) {
  MemoryTable table;
  table.reference_imgsz = 640;
  table.source = "test: CPU, instrumented allocator";
  table.provenance = {"NVIDIA H200", "amp", "2.1.2", "2026-11-30"};
  table.variants = {{"yolov8n", 0.123456789, 0.0625}, {"yolov8s", 0.5, 0.125}, {"yolov8x", 2.25, 1.0 / 3.0}};
  const std::string path = temp_path("memory_table_roundtrip.yaml");
  write_memory_table(path, table);
  const MemoryTable back = read_memory_table(path);
  EXPECT_EQ(back.reference_imgsz, 640);
  EXPECT_EQ(back.source, table.source);
  EXPECT_EQ(back.provenance.device, "NVIDIA H200");
  EXPECT_EQ(back.provenance.precision, "amp");
  EXPECT_EQ(back.provenance.libtorch, "2.1.2");
  EXPECT_EQ(back.provenance.date, "2026-11-30");
  ASSERT_EQ(back.variants.size(), 3u);
  for (size_t i = 0; i < table.variants.size(); ++i) {
    EXPECT_EQ(back.variants[i].variant, table.variants[i].variant);
    EXPECT_NEAR(back.variants[i].fixed_gib, table.variants[i].fixed_gib, 1e-8);
    EXPECT_NEAR(back.variants[i].per_image_gib, table.variants[i].per_image_gib, 1e-8);
  }
  EXPECT_NEAR(back.peak_gib("yolov8s", 16, 640), 0.5 + 16 * 0.125, 1e-8);
  EXPECT_NEAR(back.peak_gib("yolov8s", 16, 320), 0.5 + 16 * 0.125 / 4.0, 1e-8);
  EXPECT_THROW(back.peak_gib("yolov8q", 1, 640), std::out_of_range);
  std::remove(path.c_str());
}

TEST(MemoryTableTest, FitBecomesRowAtReferenceSize) {
  const double gib = kBytesPerGib;
  const MemoryFit fit =
      fit_memory({{1, static_cast<int64_t>(1.25 * gib)}, {2, static_cast<int64_t>(1.5 * gib)}}, {}, 320);
  const MemoryTableRow row = to_table_row("yolov8n", fit, 640);
  EXPECT_EQ(row.variant, "yolov8n");
  EXPECT_NEAR(row.fixed_gib, 1.0, 1e-6);
  EXPECT_NEAR(row.per_image_gib, 1.0, 1e-6);  // 0.25 GiB at 320 is 1 GiB at 640
}

TEST(MemoryTableTest, BadFilesNameFileLineAndKey) {
  const std::string path = temp_path("memory_table_bad.yaml");
  {
    std::ofstream f(path);
    f << "reference_imgsz: 640\nsource: x\nmodels:\n  yolov8n: {fixed_gib: 0.5, per_image_gib: abc}\n";
  }
  try {
    read_memory_table(path);
    FAIL() << "expected an error";
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(path + ":4"), std::string::npos) << what;
    EXPECT_NE(what.find("models.yolov8n.per_image_gib"), std::string::npos) << what;
  }
  {
    std::ofstream f(path);
    f << "reference_imgsz: 640\nmodels:\n  yolov8n: {fixed_gib: 0.5}\n";
  }
  EXPECT_THROW(read_memory_table(path), std::runtime_error);
  {
    std::ofstream f(path);
    f << "reference_imgsz: -3\nmodels: {}\n";
  }
  EXPECT_THROW(read_memory_table(path), std::runtime_error);
  {
    std::ofstream f(path);
    f << "models: [1, 2\n";
  }
  EXPECT_THROW(read_memory_table(path), std::runtime_error);
  std::remove(path.c_str());
  EXPECT_THROW(read_memory_table(path), std::runtime_error);
}

}  // namespace
}  // namespace yolo8
