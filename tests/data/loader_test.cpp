// The loader end to end: determinism across worker counts, resume, caches, validation batches,
// augmentation consistency (draw colour boxes, augment, re-detect), synthetic data.
#include "data/loader.h"

#include <fcntl.h>
#include <malloc.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#include <torch/torch.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "data/synth.h"
#include "test_util.h"

namespace yolo8::data {
namespace {
namespace fs = std::filesystem;
using yolo8::test::scratch_dir;
using yolo8::test::write_text;

std::shared_ptr<DatasetIndex> index_of(const std::string& yaml, const std::string& split) {
  CheckOptions o;
  o.workers = 2;
  return std::make_shared<DatasetIndex>(build_split_index(load_data_yaml(yaml), split, o));
}

const std::string& synth_yaml() {
  static const std::string yaml = [] {
    auto dir = scratch_dir("synth_small");
    return synthesize_dataset(dir, 24, 10, 128, 7).yaml_path;
  }();
  return yaml;
}

std::vector<Batch> run_epoch(DataLoader& dl, int64_t epoch, int64_t first = 0) {
  std::vector<Batch> out;
  dl.start_epoch(epoch, first);
  while (auto b = dl.next()) out.push_back(std::move(*b));
  return out;
}

void expect_same(const std::vector<Batch>& a, const std::vector<Batch>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].index, b[i].index);
    EXPECT_TRUE(torch::equal(a[i].images, b[i].images)) << "batch " << i;
    EXPECT_TRUE(torch::equal(a[i].labels, b[i].labels)) << "batch " << i;
    EXPECT_EQ(a[i].paths, b[i].paths);
  }
}

TEST(DataSynth, DeterministicAndValid) {
  auto a = scratch_dir("synth_a"), b = scratch_dir("synth_b");
  auto ra = synthesize_dataset(a, 6, 2, 96, 3);
  auto rb = synthesize_dataset(b, 6, 2, 96, 3);
  EXPECT_EQ(ra.train_instances, rb.train_instances);
  EXPECT_GT(ra.train_instances, 0);
  for (const char* f : {"images/train/000004.jpg", "labels/train/000004.txt", "labels/val/000001.txt"}) {
    std::ifstream fa(a + "/" + f, std::ios::binary), fb(b + "/" + f, std::ios::binary);
    std::stringstream sa, sb;
    sa << fa.rdbuf();
    sb << fb.rdbuf();
    EXPECT_FALSE(sa.str().empty()) << f;
    EXPECT_EQ(sa.str(), sb.str()) << f;
  }
  // A smaller second run into the same folder leaves none of the first run's files.
  synthesize_dataset(b, 3, 1, 96, 3);
  EXPECT_EQ(list_split_files({b + "/images/train"}).size(), 3u);
  EXPECT_FALSE(fs::exists(b + "/labels/train/000004.txt"));
  std::ostringstream os;
  EXPECT_TRUE(check_dataset(ra.yaml_path, os, 2, false)) << os.str();
  auto idx = index_of(ra.yaml_path, "train");
  EXPECT_EQ(idx->summary.images, 6);
  EXPECT_EQ(idx->summary.skipped_total(), 0);
  EXPECT_EQ(idx->summary.instances, ra.train_instances);
  EXPECT_EQ(load_data_yaml(ra.yaml_path).names, synth_class_names());
}

TEST(DataLoader, SameBatchesWhateverTheWorkerCount) {
  auto idx = index_of(synth_yaml(), "train");
  LoaderConfig cfg;
  cfg.imgsz = 128;
  cfg.batch = 5;
  cfg.seed = 11;
  AugmentConfig aug;
  aug.mixup = 0.5;
  aug.degrees = 5;
  std::vector<std::vector<Batch>> runs;
  for (int w : {0, 1, 2}) {
    cfg.workers = w;
    cfg.prefetch = w == 2 ? 1 : 3;
    DataLoader dl(idx, cfg, aug, true);
    EXPECT_EQ(dl.num_batches(), 5);
    runs.push_back(run_epoch(dl, 3));
  }
  expect_same(runs[0], runs[1]);
  expect_same(runs[0], runs[2]);
  const Batch& b0 = runs[0][0];
  EXPECT_EQ(b0.images.sizes(), (std::vector<int64_t>{5, 3, 128, 128}));
  EXPECT_EQ(b0.images.dtype(), torch::kUInt8);
  EXPECT_TRUE(b0.images.is_contiguous());
  EXPECT_EQ(b0.labels.size(1), 6);
  EXPECT_EQ(runs[0].back().images.size(0), 4);  // 24 = 4 * 5 + 4
  // Labels normalised, image index within the batch.
  for (const auto& b : runs[0]) {
    if (b.labels.size(0) == 0) continue;
    EXPECT_GE(b.labels.select(1, 0).min().item<float>(), 0);
    EXPECT_LT(b.labels.select(1, 0).max().item<float>(), b.images.size(0));
    EXPECT_GE(b.labels.slice(1, 2).min().item<float>(), 0);
    EXPECT_LE(b.labels.slice(1, 2).max().item<float>(), 1.0001);
  }
  // Another epoch shuffles differently.
  cfg.workers = 1;
  DataLoader dl(idx, cfg, aug, true);
  auto other = run_epoch(dl, 4);
  EXPECT_NE(other[0].paths, runs[0][0].paths);
}

TEST(DataLoader, ResumeMidEpoch) {
  auto idx = index_of(synth_yaml(), "train");
  LoaderConfig cfg;
  cfg.imgsz = 128;
  cfg.batch = 4;
  cfg.workers = 2;
  AugmentConfig aug;
  DataLoader full(idx, cfg, aug, true);
  auto all = run_epoch(full, 2);
  DataLoader resumed(idx, cfg, aug, true);
  auto tail = run_epoch(resumed, 2, 3);
  ASSERT_EQ(tail.size(), all.size() - 3);
  EXPECT_EQ(resumed.position(), std::make_pair(int64_t{2}, int64_t{6}));
  std::vector<Batch> expect(std::make_move_iterator(all.begin() + 3), std::make_move_iterator(all.end()));
  expect_same(expect, tail);
  Batch single = full.load_batch(2, 5);
  EXPECT_TRUE(torch::equal(single.images, tail.back().images));
  EXPECT_THROW(full.start_epoch(2, 99), std::out_of_range);
}

TEST(DataLoader, CachesGiveTheSameBatches) {
  auto idx = index_of(synth_yaml(), "train");
  LoaderConfig cfg;
  cfg.imgsz = 96;
  cfg.batch = 8;
  cfg.workers = 2;
  AugmentConfig aug;
  DataLoader plain(idx, cfg, aug, true);
  auto ref = run_epoch(plain, 0);
  cfg.cache = CacheMode::kRam;
  DataLoader ram(idx, cfg, aug, true);
  EXPECT_EQ(ram.cache(), CacheMode::kRam) << ram.cache_note();
  expect_same(ref, run_epoch(ram, 0));
  expect_same(ref, run_epoch(ram, 0));  // second pass served from RAM
  cfg.cache = CacheMode::kDisk;
  DataLoader disk(idx, cfg, aug, true);
  expect_same(ref, run_epoch(disk, 0));
  expect_same(ref, run_epoch(disk, 0));  // second pass served from the files
}

// Training keeps the last min(images, 8 x batch, 1000) decoded images, as the reference's loader does: with the
// files gone, an epoch whose images are all held still gives the batches of a loader that reads them, and one
// whose loader holds fewer than the set (batch 2: 16 of 24) has to read and names the missing file.
TEST(DataLoader, TrainingKeepsTheLastDecodedImages) {
  for (const int batch : {8, 2}) {
    SCOPED_TRACE("batch " + std::to_string(batch));
    const auto dir = scratch_dir("recent_images_b" + std::to_string(batch));
    auto idx = index_of(synthesize_dataset(dir, 24, 2, 128, 7).yaml_path, "train");
    LoaderConfig cfg;
    cfg.imgsz = 96;
    cfg.batch = batch;
    cfg.workers = 2;
    DataLoader reader(idx, cfg, AugmentConfig{}, true);
    const auto ref = run_epoch(reader, 1);
    DataLoader holder(idx, cfg, AugmentConfig{}, true);
    run_epoch(holder, 0);
    for (const auto& record : idx->records) fs::remove(record.image);
    if (batch == 8) {
      expect_same(ref, run_epoch(holder, 1));
    } else {
      try {
        run_epoch(holder, 1);
        ADD_FAILURE() << "the epoch read no file: more images held than 8 x batch";
      } catch (const std::runtime_error& e) {
        EXPECT_NE(std::string(e.what()).find(dir), std::string::npos) << e.what();
      }
    }
  }
}

TEST(DataLoader, CloseMosaic) {
  auto idx = index_of(synth_yaml(), "train");
  LoaderConfig cfg;
  cfg.imgsz = 128;
  cfg.batch = 4;
  cfg.workers = 0;
  AugmentConfig aug;  // close_mosaic 10
  DataLoader dl(idx, cfg, aug, true);
  EXPECT_TRUE(dl.update_close_mosaic(89, 100));
  auto with = run_epoch(dl, 0);
  EXPECT_FALSE(dl.update_close_mosaic(90, 100));
  auto without = run_epoch(dl, 0);
  EXPECT_FALSE(torch::equal(with[0].images, without[0].images));
  EXPECT_EQ(without[0].images.sizes(), with[0].images.sizes());
}

class DataValidationLoader : public ::testing::TestWithParam<int> {};

// imgsz 128 on 128-px files: no resize; imgsz 64 on 256-px JPEGs: shrunk by 4 (fully decoded, as validation is).
TEST_P(DataValidationLoader, RectBatchesMapBack) {
  const int imgsz = GetParam();
  std::string yaml = synth_yaml();
  if (imgsz == 64) yaml = synthesize_dataset(scratch_dir("synth_large"), 2, 10, 256, 5).yaml_path;
  auto idx = index_of(yaml, "val");
  LoaderConfig cfg;
  cfg.imgsz = imgsz;
  cfg.batch = 4;
  cfg.workers = 2;
  cfg.rect = true;
  DataLoader dl(idx, cfg, AugmentConfig{}, false);
  auto batches = run_epoch(dl, 0);
  ASSERT_EQ(batches.size(), 3u);
  double prev_ar = 0;
  int shifted = 0;  // labels of images with an odd padding in x
  for (const auto& b : batches) {
    EXPECT_EQ(b.images.size(2) % 32, 0);
    EXPECT_EQ(b.images.size(3) % 32, 0);
    EXPECT_LE(std::max(b.images.size(2), b.images.size(3)), imgsz + 32);
    for (size_t k = 0; k < b.paths.size(); ++k) {
      double ar = static_cast<double>(b.orig_shapes[k].first) / b.orig_shapes[k].second;
      EXPECT_GE(ar, prev_ar);  // sorted by aspect ratio
      prev_ar = ar;
    }
    // Boxes mapped back with ratio_pad land on the label file's boxes, once the reference's letterbox offset is
    // taken off: it moves labels by the unrounded half padding, the image by the rounded one (LetterboxInfo), so
    // where the padding is odd the labels sit half a batch pixel right of their box.
    auto rp = b.ratio_pad.accessor<double, 2>();
    for (int64_t r = 0; r < b.labels.size(0); ++r) {
      auto row = b.labels[r];
      int64_t k = static_cast<int64_t>(row[0].item<float>());
      const double new_w = std::round(b.orig_shapes[k].second * rp[k][1]);
      const double shift = (static_cast<double>(b.images.size(3)) - new_w) / 2 - rp[k][2];
      EXPECT_TRUE(shift == 0.0 || shift == 0.5) << shift;
      shifted += shift == 0.5 ? 1 : 0;
      double cx = (row[2].item<float>() * b.images.size(3) - rp[k][2] - shift) / rp[k][1] / b.orig_shapes[k].second;
      double w = row[4].item<float>() * b.images.size(3) / rp[k][1] / b.orig_shapes[k].second;
      const auto& rec = *std::find_if(idx->records.begin(), idx->records.end(),
                                      [&](const ImageRecord& x) { return x.image == b.paths[k]; });
      bool found = false;
      for (const auto& l : rec.boxes) found = found || (std::abs(l.cx - cx) < 1e-3 && std::abs(l.w - w) < 1e-3);
      EXPECT_TRUE(found) << b.paths[k] << " cx " << cx;
    }
  }
  if (imgsz == 64) EXPECT_GT(shifted, 0);  // the 256-px files shrunk by 4 include odd paddings
}
INSTANTIATE_TEST_SUITE_P(DataSizes, DataValidationLoader, ::testing::Values(128, 64));

// Without rect, validation letterboxes every image into imgsz x imgsz and keeps the file order (the reference's
// validator when `rect` is off; tests/trainer/support/val_golden_test.cpp pins the pixels).
TEST(DataLoader, SquareValidationKeepsFileOrder) {
  auto idx = index_of(synth_yaml(), "val");
  LoaderConfig cfg;
  cfg.imgsz = 96;
  cfg.batch = 4;
  cfg.workers = 2;
  DataLoader dl(idx, cfg, AugmentConfig{}, false);
  std::vector<std::string> paths;
  for (const auto& b : run_epoch(dl, 0)) {
    EXPECT_EQ(b.images.size(2), 96);
    EXPECT_EQ(b.images.size(3), 96);
    paths.insert(paths.end(), b.paths.begin(), b.paths.end());
  }
  ASSERT_EQ(paths.size(), idx->records.size());
  for (size_t i = 0; i < paths.size(); ++i) EXPECT_EQ(paths[i], idx->records[i].image);
}

// Colour-coded rectangles: class c is drawn in colour c; after augmentation each box must be filled with its
// colour and the colour must not appear outside the boxes of its class.
const cv::Vec3b kPalette[6] = {{255, 0, 0}, {0, 255, 0}, {0, 0, 255}, {255, 255, 0}, {255, 0, 255}, {0, 255, 255}};

std::string colour_dataset() {
  auto dir = scratch_dir("colour");
  const cv::Size sizes[3] = {{160, 120}, {120, 160}, {140, 140}};
  for (int i = 0; i < 12; ++i) {
    cv::Size sz = sizes[i % 3];
    cv::Mat img(sz, CV_8UC3, cv::Scalar::all(50));
    std::ostringstream lbl;
    for (int o = 0; o < 2; ++o) {
      const int cls = (i + 3 * o) % 6;
      const int w = 20 + 7 * ((i + o) % 4), h = 18 + 9 * ((i + 2 * o) % 3);
      const int x = o == 0 ? 8 + i % 5 : sz.width - w - 8 - i % 4, y = o == 0 ? 10 + i % 6 : sz.height - h - 9;
      const cv::Vec3b rgb = kPalette[cls];
      img(cv::Rect(x, y, w, h)).setTo(cv::Scalar(rgb[2], rgb[1], rgb[0]));  // BGR on disk
      lbl << cls << " " << (x + w / 2.0) / sz.width << " " << (y + h / 2.0) / sz.height << " " << double(w) / sz.width
          << " " << double(h) / sz.height << "\n";
    }
    char name[32];
    std::snprintf(name, sizeof name, "%03d", i);
    fs::create_directories(dir + "/images/train");
    cv::imwrite(dir + "/images/train/" + name + ".png", img);
    write_text(dir + "/labels/train/" + std::string(name) + ".txt", lbl.str());
  }
  write_text(dir + "/data.yaml", "path: .\ntrain: images/train\nval: images/train\nnames: [a, b, c, d, e, f]\n");
  return dir + "/data.yaml";
}

struct Consistency {
  int64_t colour_px = 0, outside_px = 0, boxes = 0, checked = 0;
  double min_fill = 1.0, sum_fill = 0.0;
  double mean_fill() const { return checked ? sum_fill / checked : 0.0; }
};

Consistency check_colours(const std::vector<Batch>& batches) {
  Consistency c;
  for (const auto& b : batches) {
    const int img_h = static_cast<int>(b.images.size(2)), img_w = static_cast<int>(b.images.size(3));
    for (int64_t k = 0; k < b.images.size(0); ++k) {
      torch::Tensor hwc = b.images[k].permute({1, 2, 0}).contiguous();
      cv::Mat rgb(img_h, img_w, CV_8UC3, hwc.data_ptr<uint8_t>());
      for (int cls = 0; cls < 6; ++cls) {
        cv::Mat mask, inbox = cv::Mat::zeros(img_h, img_w, CV_8U);
        cv::Vec3b lo, hi;
        for (int ch = 0; ch < 3; ++ch) {
          lo[ch] = static_cast<uchar>(std::max(0, kPalette[cls][ch] - 30));
          hi[ch] = static_cast<uchar>(std::min(255, kPalette[cls][ch] + 30));
        }
        cv::inRange(rgb, lo, hi, mask);
        for (int64_t r = 0; r < b.labels.size(0); ++r) {
          auto row = b.labels[r];
          if (row[0].item<float>() != k || row[1].item<float>() != cls) continue;
          const double bw = row[4].item<float>() * img_w, bh = row[5].item<float>() * img_h;
          const double x1 = row[2].item<float>() * img_w - bw / 2, y1 = row[3].item<float>() * img_h - bh / 2;
          cv::Rect box(cvRound(x1), cvRound(y1), cvRound(bw), cvRound(bh));
          box &= cv::Rect(0, 0, img_w, img_h);
          ++c.boxes;
          if (box.width >= 12 && box.height >= 12) {
            ++c.checked;
            const double fill = cv::countNonZero(mask(box)) / double(box.area());
            c.min_fill = std::min(c.min_fill, fill);
            c.sum_fill += fill;
          }
          cv::Rect grown(box.x - 2, box.y - 2, box.width + 4, box.height + 4);
          inbox(grown & cv::Rect(0, 0, img_w, img_h)).setTo(255);
        }
        c.colour_px += cv::countNonZero(mask);
        cv::Mat outside = mask & ~inbox;
        c.outside_px += cv::countNonZero(outside);
      }
    }
  }
  return c;
}

// Four augmented epochs through the real loader, then the colour re-detection check (printed for the log).
Consistency augment_and_check(const std::shared_ptr<const DatasetIndex>& idx, const LoaderConfig& cfg,
                              const AugmentConfig& aug) {
  DataLoader dl(idx, cfg, aug, true);
  std::vector<Batch> batches;
  for (int e = 0; e < 4; ++e) {
    auto b = run_epoch(dl, e);
    batches.insert(batches.end(), std::make_move_iterator(b.begin()), std::make_move_iterator(b.end()));
  }
  const Consistency c = check_colours(batches);
  std::cout << "boxes " << c.boxes << " checked " << c.checked << " min fill " << c.min_fill << " mean fill "
            << c.mean_fill() << " outside " << c.outside_px << "/" << c.colour_px << "\n";
  return c;
}

TEST(DataAugmentConsistency, BoxesCoverTheirColourAfterMosaicAndAffine) {
  auto idx = index_of(colour_dataset(), "train");
  LoaderConfig cfg;
  cfg.imgsz = 128;
  cfg.batch = 4;
  cfg.workers = 2;
  AugmentConfig aug;
  aug.hsv_h = aug.hsv_s = aug.hsv_v = 0;  // colours must survive
  aug.flipud = 0.5;
  const Consistency c = augment_and_check(idx, cfg, aug);
  EXPECT_GT(c.checked, 40);
  EXPECT_GT(c.min_fill, 0.75);  // axis-aligned warp: a box is its rectangle up to blurred edges
  EXPECT_GT(c.mean_fill(), 0.85);
  EXPECT_LT(c.outside_px, c.colour_px * 0.03);  // only slivers whose boxes were filtered
}

TEST(DataAugmentConsistency, RotatedBoxesStillEncloseTheirColour) {
  auto idx = index_of(colour_dataset(), "train");
  LoaderConfig cfg;
  cfg.imgsz = 128;
  cfg.batch = 4;
  cfg.workers = 2;
  AugmentConfig aug;
  aug.hsv_h = aug.hsv_s = aug.hsv_v = 0;
  aug.degrees = 20;
  aug.shear = 5;
  aug.perspective = 0.0005;
  const Consistency c = augment_and_check(idx, cfg, aug);
  EXPECT_GT(c.checked, 40);
  EXPECT_GT(c.min_fill, 0.15);  // a clipped corner of a rotated thin rectangle fills little of its box
  EXPECT_GT(c.mean_fill(), 0.5);
  EXPECT_LT(c.outside_px, c.colour_px * 0.03);
}

TEST(DataLoader, SingleClsFractionAndRectTraining) {
  auto idx = index_of(synth_yaml(), "train");
  LoaderConfig cfg;
  cfg.imgsz = 64;
  cfg.batch = 4;
  cfg.workers = 2;
  cfg.single_cls = true;
  cfg.fraction = 0.5;
  DataLoader dl(idx, cfg, AugmentConfig{}, true);
  EXPECT_EQ(dl.size(), 12);
  auto batches = run_epoch(dl, 0);
  int64_t n_labels = 0;
  for (const auto& b : batches) {
    n_labels += b.labels.size(0);
    if (b.labels.size(0)) {
      EXPECT_EQ(b.labels.select(1, 1).abs().max().item<float>(), 0.f);
    }
  }
  EXPECT_GT(n_labels, 0);

  cfg.single_cls = false;
  cfg.fraction = 1.0;
  cfg.rect = true;
  DataLoader rect(idx, cfg, AugmentConfig{}, true);
  EXPECT_FALSE(rect.mosaic());
  auto e0 = run_epoch(rect, 0), e1 = run_epoch(rect, 1);
  ASSERT_EQ(e0.size(), e1.size());
  bool any_diff = false;
  for (size_t i = 0; i < e0.size(); ++i) {
    EXPECT_EQ(e0[i].paths, e1[i].paths);  // rectangular batches keep their order
    EXPECT_EQ(e0[i].images.size(2) % 32, 0);
    EXPECT_EQ(e0[i].images.size(3) % 32, 0);
    any_diff = any_diff || !torch::equal(e0[i].images, e1[i].images);  // colour and flips still vary
  }
  EXPECT_TRUE(any_diff);
}

TEST(DataLoader, BadInputs) {
  auto idx = index_of(synth_yaml(), "train");
  LoaderConfig cfg;
  cfg.imgsz = 100;
  EXPECT_THROW(DataLoader(idx, cfg, AugmentConfig{}, true), std::invalid_argument);
  EXPECT_THROW(DataLoader(std::make_shared<DatasetIndex>(), LoaderConfig{}, AugmentConfig{}, true), std::runtime_error);
  cfg.imgsz = 64;
  cfg.workers = 1;
  DataLoader dl(idx, cfg, AugmentConfig{}, true);
  EXPECT_THROW(dl.next(), std::logic_error);
}

// A worker stuck in a read that does not return (an image on a hung network filesystem: here a FIFO nobody
// writes) never delivers its batch: next() without give_up would wait forever; with it, next() throws once
// give_up says so.
TEST(DataLoader, NextGivesUpOnABatchAStuckWorkerNeverDelivers) {
  const std::string dir = scratch_dir("loader_stuck");
  const auto idx = index_of(synthesize_dataset(dir, 8, 2, 64, 3).yaml_path, "train");
  const std::string stuck = idx->records.front().image;
  fs::remove(stuck);
  ASSERT_EQ(mkfifo(stuck.c_str(), 0644), 0);
  LoaderConfig cfg;
  cfg.imgsz = 64;
  cfg.batch = 8;  // the whole split: the first batch needs the FIFO's image
  cfg.workers = 1;
  DataLoader dl(idx, cfg, AugmentConfig{}, true);
  dl.start_epoch(0);
  int asked = 0;
  EXPECT_THROW(dl.next([&] { return ++asked == 3; }), WaitAbandoned);
  EXPECT_EQ(asked, 3);
  // Let the worker's open() return (an empty read, a load error) so the loader can be destroyed.
  int writer = -1;
  for (int tries = 0; writer < 0 && tries < 500; ++tries) {
    writer = ::open(stuck.c_str(), O_WRONLY | O_NONBLOCK);  // fails until a reader waits in the FIFO
    if (writer < 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_GE(writer, 0) << "the worker never opened the FIFO";
  ::close(writer);
  EXPECT_THROW(dl.next(), std::runtime_error);
}

TEST(DataLoader, ShardOrderDealsAnEpochEvenlyAcrossRanks) {
  const std::vector<size_t> order = {9, 4, 7, 1, 0, 3, 8};
  EXPECT_EQ(shard_order(order, 0, 1), order);
  EXPECT_EQ(shard_order(order, 0, 2), (std::vector<size_t>{9, 7, 0, 8}));
  EXPECT_EQ(shard_order(order, 1, 2), (std::vector<size_t>{4, 1, 3, 9}));  // padded by wrapping around
  std::vector<size_t> seen;
  for (int rank = 0; rank < 3; ++rank) {
    const auto shard = shard_order(order, rank, 3);
    EXPECT_EQ(shard.size(), 3u);
    seen.insert(seen.end(), shard.begin(), shard.end());
  }
  std::sort(seen.begin(), seen.end());
  seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
  EXPECT_EQ(seen.size(), order.size()) << "every sample is used";
  EXPECT_TRUE(shard_order({}, 1, 2).empty());
  EXPECT_THROW(shard_order(order, 2, 2), std::invalid_argument);
}

}  // namespace
}  // namespace yolo8::data

#ifdef __GLIBC__
// A 64 MiB block (over glibc's largest mmap threshold) freed and allocated again must come from the heap, not
// from a fresh mapping whose pages the kernel zero-fills at every batch.
TEST(DataHeap, LargeBuffersComeFromTheHeapNotFreshMappings) {
  yolo8::data::keep_large_buffers_in_heap();
  const size_t mapped_before = mallinfo2().hblkhd;
  constexpr size_t kBytes = size_t{64} << 20;
  for (int round = 0; round < 2; ++round) {
    auto* block = static_cast<volatile char*>(std::malloc(kBytes));
    ASSERT_NE(block, nullptr);
    block[0] = 1;
    block[kBytes - 1] = 1;
    EXPECT_LT(mallinfo2().hblkhd, mapped_before + kBytes) << "round " << round;
    std::free(const_cast<char*>(block));
  }
}
#endif
