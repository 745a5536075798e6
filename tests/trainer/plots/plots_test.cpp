#include "trainer/plots/plots.h"

#include <gtest/gtest.h>
#include <opencv2/imgcodecs.hpp>

#include <filesystem>
#include <fstream>
#include <limits>
#include <string>

#include "test_paths.h"
#include "trainer/detect/confusion_matrix.h"
#include "trainer/detect/metrics.h"
#include "trainer/runtime/run_dir.h"

namespace yolo8 {
namespace {

namespace fs = std::filesystem;

std::string out_path(const std::string& name) {
  const auto dir = fs::path(test::kBinaryDir) / "plots_test_out";
  fs::create_directories(dir);
  return (dir / name).string();
}

// The file exists, is non-empty and decodes to an image of the expected size.
void expect_image(const std::string& path, int width, int height) {
  ASSERT_TRUE(fs::exists(path)) << path;
  EXPECT_GT(fs::file_size(path), 1000u) << path;
  const cv::Mat img = cv::imread(path, cv::IMREAD_COLOR);
  ASSERT_FALSE(img.empty()) << path;
  EXPECT_EQ(img.cols, width) << path;
  EXPECT_EQ(img.rows, height) << path;
}

const char* kHeader =
    "                  epoch,         train/box_loss,         train/cls_loss,         train/dfl_loss,   "
    "metrics/precision(B),      metrics/recall(B),       metrics/mAP50(B),    metrics/mAP50-95(B),           "
    "val/box_loss,           val/cls_loss,           val/dfl_loss,                 lr/pg0,                 time";

void write_results(const std::string& path, int epochs) {
  std::ofstream f(path);
  f << kHeader << "\n";
  for (int e = 1; e <= epochs; ++e) {
    const double t = e / static_cast<double>(epochs);
    const double noise = 0.03 * std::sin(e * 2.3);
    f << e << ", " << 2.0 - t + noise << ", " << 3.0 - 2 * t + noise << ", " << 1.5 - 0.4 * t << ", "
      << 0.3 + 0.6 * t + noise << ", " << 0.2 + 0.7 * t << ", " << 0.1 + 0.8 * t + noise << ", " << 0.05 + 0.6 * t
      << ", " << 1.8 - 0.8 * t << ", " << 2.5 - 1.5 * t + noise << ", " << 1.4 - 0.3 * t << ", " << 0.01 << ", "
      << 10 * e << "\n";
  }
}

TEST(PlotResultsCsv, WritesGridOfCurves) {
  const auto csv = out_path("results.csv");
  write_results(csv, 40);
  const auto png = out_path("results.png");
  plot_results_csv(csv, png);
  expect_image(png, kResultsPlotSize.width, kResultsPlotSize.height);

  // One epoch is enough to plot.
  write_results(csv, 1);
  plot_results_csv(csv, out_path("results_one.png"));
  expect_image(out_path("results_one.png"), kResultsPlotSize.width, kResultsPlotSize.height);
}

TEST(PlotResultsCsv, ReadsTheEnginesOwnFile) {
  const auto csv = out_path("engine_results.csv");
  fs::remove(csv);
  ResultsCsv writer(csv);
  for (int e = 1; e <= 12; ++e) {
    const double value = 0.5 / e;
    ResultsRow row{e,     value, value, value, value, value, value, value, value,
                   value, value, value, value, value, value, value, value, value};
    row.val_cls_loss = std::numeric_limits<double>::quiet_NaN();  // a missing value is skipped, not fatal
    writer.append(row);
  }
  plot_results_csv(csv, out_path("engine_results.png"));
  expect_image(out_path("engine_results.png"), kResultsPlotSize.width, kResultsPlotSize.height);
}

void expect_throw_mentioning(const std::string& csv, const std::string& what) {
  try {
    plot_results_csv(csv, out_path("never.png"));
    FAIL() << "no exception for " << csv;
  } catch (const std::runtime_error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(csv), std::string::npos) << msg;
    EXPECT_NE(msg.find(what), std::string::npos) << msg;
  }
}

TEST(PlotResultsCsv, MissingOrMalformedFileNamesIt) {
  expect_throw_mentioning(out_path("does_not_exist.csv"), "cannot be opened");

  const auto empty = out_path("empty.csv");
  std::ofstream(empty).close();
  expect_throw_mentioning(empty, "empty");

  const auto header_only = out_path("header_only.csv");
  std::ofstream(header_only) << kHeader << "\n";
  expect_throw_mentioning(header_only, "no data rows");

  const auto no_column = out_path("no_column.csv");
  std::ofstream(no_column) << "epoch, train/box_loss\n1, 0.5\n";
  expect_throw_mentioning(no_column, "train/cls_loss");

  const auto bad_number = out_path("bad_number.csv");
  write_results(bad_number, 3);
  std::ofstream(bad_number, std::ios::app) << "4, x, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1\n";
  expect_throw_mentioning(bad_number, "line 5");

  const auto short_row = out_path("short_row.csv");
  write_results(short_row, 2);
  std::ofstream(short_row, std::ios::app) << "3, 1, 1\n";
  expect_throw_mentioning(short_row, "line 4");
}

ApPerClass sample_stats(int64_t nc) {
  torch::manual_seed(0);
  const int64_t n = 400;
  auto conf = torch::rand({n}, torch::kDouble);
  auto pred_cls = torch::randint(0, nc, {n}, torch::kLong).to(torch::kDouble);
  // Confident detections are more often right.
  auto tp = (torch::rand({n, 10}, torch::kDouble) < conf.unsqueeze(1) * torch::linspace(1.0, 0.5, 10, torch::kDouble));
  auto target_cls = torch::randint(0, nc, {300}, torch::kLong).to(torch::kDouble);
  return ap_per_class(tp, conf, pred_cls, target_cls);
}

TEST(PlotCurves, PrAndConfidenceCurves) {
  const std::vector<std::string> names{"person", "bicycle", "car", "motorcycle", "airplane"};
  const auto stats = sample_stats(5);
  ASSERT_EQ(stats.prec_values.size(0), 5);
  plot_pr_curve(out_path("PR_curve.png"), stats, names);
  plot_f1_curve(out_path("F1_curve.png"), stats, names);
  plot_p_curve(out_path("P_curve.png"), stats, names);
  plot_r_curve(out_path("R_curve.png"), stats, names);
  for (const char* f : {"PR_curve.png", "F1_curve.png", "P_curve.png", "R_curve.png"})
    expect_image(out_path(f), kCurvePlotSize.width, kCurvePlotSize.height);

  // Many classes: grey curves without a per-class legend; no stats at all: empty axes.
  plot_pr_curve(out_path("PR_curve_many.png"), sample_stats(40), {});
  expect_image(out_path("PR_curve_many.png"), kCurvePlotSize.width, kCurvePlotSize.height);
  plot_f1_curve(out_path("F1_curve_empty.png"), ApPerClass{}, names);
  expect_image(out_path("F1_curve_empty.png"), kCurvePlotSize.width, kCurvePlotSize.height);
}

TEST(PlotConfusionMatrix, CountsAndNormalized) {
  ConfusionMatrix cm(4);
  torch::manual_seed(1);
  auto labels = torch::zeros({30, 5}, torch::kDouble);
  labels.select(1, 0).copy_(torch::randint(0, 4, {30}, torch::kLong));
  auto xy = torch::arange(30, torch::kDouble) * 20;
  labels.select(1, 1).copy_(xy);
  labels.select(1, 2).copy_(xy);
  labels.select(1, 3).copy_(xy + 10);
  labels.select(1, 4).copy_(xy + 10);
  auto det = torch::zeros({28, 6}, torch::kDouble);
  det.narrow(1, 0, 4).copy_(labels.narrow(0, 0, 28).narrow(1, 1, 4));
  det.select(1, 4).fill_(0.9);
  // Most detections are right, every fourth one confuses the class.
  auto cls = labels.narrow(0, 0, 28).select(1, 0).clone();
  cls.index_put_({torch::arange(0, 28, 4)}, (cls.index({torch::arange(0, 28, 4)}) + 1).remainder(4));
  det.select(1, 5).copy_(cls);
  cm.update(det, labels);
  ASSERT_EQ(cm.matrix().sum().item<double>(), 30);

  const std::vector<std::string> names{"cat", "dog", "horse", "zebra"};
  plot_confusion_matrix(out_path("confusion_matrix.png"), cm.matrix(), names, false);
  plot_confusion_matrix(out_path("confusion_matrix_normalized.png"), cm.matrix(), names, true);
  expect_image(out_path("confusion_matrix.png"), kConfusionPlotSize.width, kConfusionPlotSize.height);
  expect_image(out_path("confusion_matrix_normalized.png"), kConfusionPlotSize.width, kConfusionPlotSize.height);

  // 80 classes: no numbers in the cells, index tick labels when names do not match.
  plot_confusion_matrix(out_path("confusion_matrix_80.png"), torch::rand({81, 81}), {}, true);
  expect_image(out_path("confusion_matrix_80.png"), kConfusionPlotSize.width, kConfusionPlotSize.height);

  EXPECT_THROW(plot_confusion_matrix(out_path("bad.png"), torch::zeros({3, 4}), names, true), std::invalid_argument);
}

TEST(PlotLabels, HistogramAndDensities) {
  torch::manual_seed(2);
  const int64_t n = 2000;
  auto labels = torch::zeros({n, 5}, torch::kDouble);
  labels.select(1, 0).copy_(torch::randint(0, 6, {n}, torch::kLong).pow(2).floor_divide(6));
  labels.select(1, 1).copy_(torch::rand({n}, torch::kDouble) * 0.8 + 0.1);
  labels.select(1, 2).copy_((torch::randn({n}, torch::kDouble) * 0.15 + 0.5).clamp(0, 1));
  labels.select(1, 3).copy_(torch::rand({n}, torch::kDouble) * 0.3 + 0.02);
  labels.select(1, 4).copy_(labels.select(1, 3) * (torch::rand({n}, torch::kDouble) + 0.5));
  for (const char* f : {"labels.jpg", "labels.png"}) {
    plot_labels(out_path(f), labels, {"circle", "square", "triangle", "star", "cross", "ring"});
    expect_image(out_path(f), kLabelsPlotSize.width, kLabelsPlotSize.height);
  }

  data::DatasetIndex index;
  index.records.resize(3);
  index.records[0].boxes = {{1.f, 0.5f, 0.5f, 0.2f, 0.3f}, {0.f, 0.1f, 0.2f, 0.05f, 0.05f}};
  index.records[2].boxes = {{2.f, 0.7f, 0.6f, 0.4f, 0.1f}};
  const auto from_index = dataset_labels(index);
  ASSERT_EQ(from_index.sizes(), (torch::IntArrayRef{3, 5}));
  EXPECT_FLOAT_EQ(from_index[2][0].item<float>(), 2.f);
  EXPECT_FLOAT_EQ(from_index[1][4].item<float>(), 0.05f);
  EXPECT_EQ(dataset_labels(data::DatasetIndex{}).size(0), 0);

  plot_labels(out_path("labels_empty.png"), dataset_labels(data::DatasetIndex{}), {});
  expect_image(out_path("labels_empty.png"), kLabelsPlotSize.width, kLabelsPlotSize.height);
  EXPECT_THROW(plot_labels(out_path("bad.png"), torch::zeros({3, 4}), {}), std::invalid_argument);
}

cv::Vec3b pixel(const cv::Mat& img, int x, int y) { return img.at<cv::Vec3b>(y, x); }

cv::Vec3b bgr_of(int64_t cls) {
  const auto c = class_color(cls);
  return {c.b, c.g, c.r};
}

// Pixels of `img` inside `area` equal to `colour`.
int count_pixels(const cv::Mat& img, const cv::Rect& area, const cv::Vec3b& colour) {
  int n = 0;
  for (int y = area.y; y < area.y + area.height; ++y) {
    for (int x = area.x; x < area.x + area.width; ++x) n += pixel(img, x, y) == colour;
  }
  return n;
}

// Pixels of a density's blue shades (blue well above red, BGR), not the bars' colour.
int count_density_pixels(const cv::Mat& img, const cv::Rect& area, const cv::Vec3b& bars) {
  int n = 0;
  for (int y = area.y; y < area.y + area.height; ++y) {
    for (int x = area.x; x < area.x + area.width; ++x) {
      const cv::Vec3b p = pixel(img, x, y);
      n += p != bars && p[0] > p[2] + 40;
    }
  }
  return n;
}

TEST(PlotLabelsCorrelogram, HistogramsOnTheDiagonalDensitiesBelowNothingAbove) {
  torch::manual_seed(3);
  const int64_t n = 500;
  auto labels = torch::rand({n, 5}, torch::kDouble) * 0.5 + 0.25;
  labels.select(1, 0).zero_();
  const int w = kCorrelogramPlotSize.width, h = kCorrelogramPlotSize.height;
  plot_labels_correlogram(out_path("labels_correlogram.jpg"), labels);
  expect_image(out_path("labels_correlogram.jpg"), w, h);
  const auto png = out_path("labels_correlogram.png");
  plot_labels_correlogram(png, labels);
  const cv::Mat img = cv::imread(png, cv::IMREAD_COLOR);
  ASSERT_EQ(img.cols, w);
  ASSERT_EQ(img.rows, h);
  const cv::Vec3b white(255, 255, 255);
  const cv::Rect top_left(0, 0, w / 4, h / 4), top_right(w * 4 / 5, 0, w / 5, h / 5),
      bottom_left(0, h * 3 / 4, w / 4, h / 4), bottom_right(w * 3 / 4, h * 3 / 4, w / 4, h / 4);
  EXPECT_GT(count_pixels(img, top_left, bgr_of(0)), 1000);           // the x histogram's bars
  EXPECT_GT(count_pixels(img, bottom_right, bgr_of(0)), 1000);       // the height histogram's bars
  EXPECT_EQ(count_pixels(img, top_right, white), top_right.area());  // the empty upper triangle
  // x against height: density bins (the data fill a quarter of the cell), none of them the bars' colour.
  EXPECT_GT(count_density_pixels(img, bottom_left, bgr_of(0)), 5000);
  EXPECT_EQ(count_pixels(img, bottom_left, bgr_of(0)), 0);

  const auto empty = out_path("labels_correlogram_empty.png");
  plot_labels_correlogram(empty, torch::zeros({0, 5}));
  const cv::Mat blank = cv::imread(empty, cv::IMREAD_COLOR);
  ASSERT_EQ(blank.cols, w);
  EXPECT_EQ(count_pixels(blank, top_left, bgr_of(0)), 0);
  EXPECT_EQ(count_density_pixels(blank, bottom_left, bgr_of(0)), 0);
  EXPECT_THROW(plot_labels_correlogram(out_path("bad.png"), torch::zeros({3, 4})), std::invalid_argument);
}

TEST(PlotBatchMosaic, BoxesInClassColour) {
  auto images = torch::zeros({4, 3, 64, 64}, torch::kUInt8);
  images[3].fill_(128);
  // Image 1: one class-2 box covering the middle half of the tile (pixels 16..48).
  auto labels = torch::tensor({{1.0, 2.0, 0.5, 0.5, 0.5, 0.5}}, torch::kDouble);
  const auto png = out_path("mosaic_small.png");
  plot_batch_mosaic(png, images, labels, {"a", "b", "c"});
  const auto size = mosaic_size(4, 64, 64);
  EXPECT_EQ(size.width, 128);
  EXPECT_EQ(size.height, 128);
  const cv::Mat img = cv::imread(png, cv::IMREAD_COLOR);
  ASSERT_FALSE(img.empty());
  ASSERT_EQ(img.cols, 128);
  ASSERT_EQ(img.rows, 128);
  // Tile 1 is the top-right one: bottom edge of its box at y 48, x 64 + 32; left edge at x 64 + 16.
  EXPECT_EQ(pixel(img, 64 + 32, 48), bgr_of(2));
  EXPECT_EQ(pixel(img, 64 + 16, 40), bgr_of(2));
  // Same place in tile 0 (no box) stays black; the box interior is untouched.
  EXPECT_EQ(pixel(img, 32, 48), cv::Vec3b(0, 0, 0));
  EXPECT_EQ(pixel(img, 64 + 32, 36), cv::Vec3b(0, 0, 0));
  EXPECT_EQ(pixel(img, 64 + 40, 64 + 40), cv::Vec3b(128, 128, 128));  // tile 3 is grey
}

TEST(PlotBatchMosaic, PredictionsBelowConfidenceAreNotDrawn) {
  auto images = torch::zeros({1, 3, 100, 100}, torch::kUInt8);
  // Pixel boxes (coordinates > 1.1): class 0 kept at conf 0.9, class 1 dropped at conf 0.1.
  auto labels =
      torch::tensor({{0.0, 0.0, 30.0, 50.0, 40.0, 60.0, 0.9}, {0.0, 1.0, 75.0, 50.0, 30.0, 60.0, 0.1}}, torch::kDouble);
  const auto png = out_path("mosaic_pred.png");
  plot_batch_mosaic(png, images, labels, {"kept", "dropped"}, {"/data/images/im0.jpg"});
  const cv::Mat img = cv::imread(png, cv::IMREAD_COLOR);
  ASSERT_EQ(img.cols, 100);
  EXPECT_EQ(pixel(img, 30, 80), bgr_of(0));           // bottom edge of the kept box
  EXPECT_EQ(pixel(img, 75, 80), cv::Vec3b(0, 0, 0));  // where the dropped box's edge would be
}

TEST(PlotBatchMosaic, LargeBatchIsCappedAndScaled) {
  EXPECT_EQ(mosaic_size(20, 320, 320).width, 1280);
  EXPECT_EQ(mosaic_size(16, 640, 640).width, 1920);
  EXPECT_EQ(mosaic_size(3, 640, 480).height, 1280);
  EXPECT_EQ(mosaic_size(3, 640, 480).width, 960);
  torch::manual_seed(3);
  auto images = torch::randint(0, 255, {20, 3, 160, 192}, torch::kLong).to(torch::kUInt8);
  auto labels = torch::rand({60, 6}, torch::kDouble);
  labels.select(1, 0).copy_(torch::randint(0, 20, {60}, torch::kLong));
  labels.select(1, 1).copy_(torch::randint(0, 12, {60}, torch::kLong));
  labels.narrow(1, 4, 2).mul_(0.4);
  const auto size = mosaic_size(20, 160, 192);
  for (const char* f : {"train_batch0.jpg", "train_batch0.png"}) {
    plot_batch_mosaic(out_path(f), images, labels, {});
    expect_image(out_path(f), size.width, size.height);
  }
  EXPECT_EQ(size.width, 4 * 192);

  EXPECT_THROW(plot_batch_mosaic(out_path("bad.png"), torch::zeros({2, 64, 64}), labels, {}), std::invalid_argument);
  EXPECT_THROW(plot_batch_mosaic(out_path("bad.png"), images, torch::zeros({2, 5}), {}), std::invalid_argument);
}

TEST(PlotBatchMosaic, ValidatorDetectionsMapToBatchPixels) {
  // Image 1 letterboxed with gain 0.5 (w and h) and 10 px of left padding into a 100 x 200 (h x w) batch.
  auto ratio_pad = torch::tensor({{1.0, 1.0, 0.0, 0.0}, {0.5, 0.5, 10.0, 0.0}}, torch::kDouble);
  std::vector<torch::Tensor> dets{torch::zeros({0, 6}),
                                  torch::tensor({{20.0, 40.0, 100.0, 120.0, 0.8, 3.0}}, torch::kDouble)};
  const auto rows = detections_to_mosaic_rows(dets, ratio_pad, 100, 200);
  ASSERT_EQ(rows.sizes(), (torch::IntArrayRef{1, 7}));
  // batch box: x 20..60, y 20..60 -> centre (40, 40), size 40 x 40.
  const auto expected = torch::tensor({1.0, 3.0, 40.0 / 200, 40.0 / 100, 40.0 / 200, 40.0 / 100, 0.8}, torch::kDouble);
  EXPECT_TRUE(torch::allclose(rows[0], expected)) << rows;
  // Without ratio_pad the boxes are taken as batch pixels.
  const auto same = detections_to_mosaic_rows(dets, torch::Tensor(), 100, 200);
  EXPECT_NEAR(same[0][2].item<double>(), 60.0 / 200, 1e-12);
  EXPECT_EQ(detections_to_mosaic_rows({}, torch::Tensor(), 10, 10).size(0), 0);
  EXPECT_THROW(detections_to_mosaic_rows(dets, torch::zeros({1, 4}), 100, 200), std::invalid_argument);
}

TEST(PlotValidation, WritesTheReferenceFileSet) {
  const auto dir = fs::path(out_path("val_dir")).string();
  fs::remove_all(dir);
  ConfusionMatrix cm(5);
  cm.update(torch::tensor({{0.0, 0.0, 10.0, 10.0, 0.9, 1.0}}, torch::kDouble),
            torch::tensor({{1.0, 0.0, 0.0, 10.0, 10.0}}, torch::kDouble));
  plot_validation(dir, sample_stats(5), cm.matrix(), {"a", "b", "c", "d", "e"});
  for (const char* f : {"PR_curve.png", "F1_curve.png", "P_curve.png", "R_curve.png", "confusion_matrix.png",
                        "confusion_matrix_normalized.png"}) {
    EXPECT_TRUE(fs::exists(fs::path(dir) / f)) << f;
  }
}

TEST(PlotOutput, UnwritablePathNamesTheFile) {
  const auto bad = out_path("plot.unknown_extension");
  try {
    plot_labels(bad, torch::zeros({0, 5}), {});
    FAIL() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace yolo8
