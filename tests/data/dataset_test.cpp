// data.yaml parsing, label paths, verification of a dataset seeded with every kind of bad file, index cache.
#include "data/dataset.h"

#include <gtest/gtest.h>
#include <opencv2/imgcodecs.hpp>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "data/config.h"
#include "test_util.h"

namespace yolo8::data {
namespace {
namespace fs = std::filesystem;
using yolo8::test::scratch_dir;
using yolo8::test::write_text;

CheckOptions no_cache() {
  CheckOptions o;
  o.workers = 1;
  o.use_cache = false;
  return o;
}

void write_image(const std::string& path, int w, int h) {
  fs::create_directories(fs::path(path).parent_path());
  cv::Mat m(h, w, CV_8UC3, cv::Scalar(30, 90, 200));
  ASSERT_TRUE(cv::imwrite(path, m)) << path;
}

TEST(DataYaml, ListNamesAndRelativePath) {
  auto dir = scratch_dir("yaml_list");
  fs::create_directories(dir + "/ds/images/train");
  fs::create_directories(dir + "/ds/images/val");
  write_text(dir + "/data.yaml", "path: ds\ntrain: images/train\nval: [images/val, images/train]\nnames: [a, b, c]\n");
  DatasetSpec s = load_data_yaml(dir + "/data.yaml");
  EXPECT_EQ(s.nc, 3);
  EXPECT_EQ(s.names, (std::vector<std::string>{"a", "b", "c"}));
  ASSERT_EQ(s.train.size(), 1u);
  EXPECT_EQ(s.train[0], (fs::path(dir) / "ds/images/train").lexically_normal().string());
  EXPECT_EQ(s.val.size(), 2u);
  EXPECT_TRUE(s.test.empty());
}

TEST(DataYaml, DictNamesWithoutPathUseYamlFolder) {
  auto dir = scratch_dir("yaml_dict");
  fs::create_directories(dir + "/images/train");
  write_text(dir + "/data.yaml", "train: images/train\nval: images/train\nnames:\n  1: dog\n  0: cat\nnc: 2\n");
  DatasetSpec s = load_data_yaml(dir + "/data.yaml");
  EXPECT_EQ(s.names, (std::vector<std::string>{"cat", "dog"}));
  EXPECT_EQ(s.train[0], (fs::path(dir) / "images/train").lexically_normal().string());
}

TEST(DataYaml, ErrorsNameFileLineAndKey) {
  auto dir = scratch_dir("yaml_err");
  fs::create_directories(dir + "/images/train");
  write_text(dir + "/a.yaml", "train: images/train\nnames: [a, b]\nnc: 3\n");
  try {
    load_data_yaml(dir + "/a.yaml");
    FAIL() << "nc mismatch accepted";
  } catch (const std::runtime_error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("a.yaml:3"), std::string::npos) << m;
    EXPECT_NE(m.find("'nc'"), std::string::npos) << m;
  }
  write_text(dir + "/b.yaml", "train: images/nowhere\nnames: [a]\n");
  try {
    load_data_yaml(dir + "/b.yaml");
    FAIL() << "missing split accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("'train'"), std::string::npos) << e.what();
  }
  write_text(dir + "/c.yaml", "train: [unclosed\n");
  EXPECT_THROW(load_data_yaml(dir + "/c.yaml"), std::runtime_error);
  EXPECT_THROW(load_data_yaml(dir + "/missing.yaml"), std::runtime_error);
}

TEST(DataYaml, TxtListRelativeToItsFolder) {
  auto dir = scratch_dir("yaml_txt");
  write_image(dir + "/images/x/a.png", 20, 20);
  write_image(dir + "/images/x/b.png", 20, 20);
  write_text(dir + "/train.txt", "./images/x/b.png\n\n" + dir + "/images/x/a.png\n");
  auto files = list_split_files({dir + "/train.txt"});
  ASSERT_EQ(files.size(), 2u);
  EXPECT_EQ(files[0], dir + "/images/x/a.png");
  EXPECT_EQ(files[1], dir + "/images/x/b.png");
}

TEST(DataLabelPath, LastImagesFolderBecomesLabels) {
  EXPECT_EQ(label_path_for("/d/images/train/images/a.jpg"), "/d/images/train/labels/a.txt");
  EXPECT_EQ(label_path_for("/d/images/a.b.png"), "/d/labels/a.b.txt");
  EXPECT_EQ(label_path_for("/d/pics/a.png"), "/d/pics/a.txt");
}

TEST(DataConfig, ValidateNamesTheKey) {
  LoaderConfig l;
  l.imgsz = 100;
  try {
    validate(l);
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()).rfind("imgsz", 0), 0u) << e.what();
  }
  AugmentConfig a;
  a.fliplr = 1.5;
  EXPECT_THROW(validate(a), std::invalid_argument);
  EXPECT_EQ(parse_cache_mode("RAM"), CacheMode::kRam);
  EXPECT_EQ(parse_cache_mode("disk"), CacheMode::kDisk);
  EXPECT_EQ(parse_cache_mode("none"), CacheMode::kNone);
  EXPECT_THROW(parse_cache_mode("gpu"), std::invalid_argument);
}

// Every kind of bad file next to good ones; the summary must count each reason exactly.
std::string make_messy_dataset() {
  auto dir = scratch_dir("messy");
  const std::string im = dir + "/images/train/", lb = dir + "/labels/train/";
  write_image(im + "good.jpg", 64, 48);
  write_text(lb + "good.txt", "0 0.5 0.5 0.2 0.2\n");
  write_image(im + "poly.png", 40, 40);
  write_text(lb + "poly.txt", "1 0.1 0.1 0.4 0.1 0.4 0.5 0.1 0.5\n");
  write_image(im + "dup.png", 40, 40);
  write_text(lb + "dup.txt", "2 0.5 0.5 0.2 0.2\n2 0.5 0.5 0.2 0.2\n\n1 0.3 0.3 0.1 0.1\n");
  write_image(im + "bg_missing.png", 40, 40);
  write_image(im + "bg_empty.png", 40, 40);
  write_text(lb + "bg_empty.txt", "\n");
  write_image(im + "tol.png", 40, 40);
  write_text(lb + "tol.txt", "0 1.0005 0.5 0.2 0.2\n");
  {
    // A JPEG cut in half still "decodes", half grey: skipped. One that only lacks its end marker: used, noted.
    cv::Mat m(64, 64, CV_8UC3);
    cv::randu(m, cv::Scalar::all(0), cv::Scalar::all(255));
    std::vector<uchar> buf;
    cv::imencode(".jpg", m, buf);
    std::ofstream(im + "truncated.jpg", std::ios::binary)
        .write(reinterpret_cast<const char*>(buf.data()), static_cast<std::streamsize>(buf.size() / 2));
    write_text(lb + "truncated.txt", "2 0.5 0.5 0.3 0.3\n");
    std::ofstream(im + "no_end_marker.jpg", std::ios::binary)
        .write(reinterpret_cast<const char*>(buf.data()), static_cast<std::streamsize>(buf.size() - 2));
    write_text(lb + "no_end_marker.txt", "1 0.5 0.5 0.3 0.3\n");
  }
  write_text(im + "corrupt.jpg", "this is not a jpeg");
  write_text(lb + "corrupt.txt", "0 0.5 0.5 0.2 0.2\n");
  write_image(im + "tiny.png", 8, 30);
  write_text(im + "notes.xyz", "hello");
  write_image(im + "arity.png", 40, 40);
  write_text(lb + "arity.txt", "0 0.5 0.5 0.2\n");
  write_image(im + "cls.png", 40, 40);
  write_text(lb + "cls.txt", "0 0.5 0.5 0.2 0.2\n7 0.5 0.5 0.2 0.2\n");
  write_image(im + "range.png", 40, 40);
  write_text(lb + "range.txt", "0 1.5 0.5 0.2 0.2\n");
  write_image(im + "nan.png", 40, 40);
  write_text(lb + "nan.txt", "0 nan 0.5 0.2 0.2\n");
  write_image(im + "zero.png", 40, 40);
  write_text(lb + "zero.txt", "0 0.5 0.5 0 0.2\n");
  write_image(im + "multi.png", 40, 40);
  write_text(lb + "multi.txt", "0 0.5 0.5 0.2 0.2\n0 0.5 0.5\n9 0.5 0.5 0.2 0.2\n");
  write_text(dir + "/data.yaml", "path: .\ntrain: images/train\nval: images/train\nnames: [a, b, c]\n");
  return dir;
}

TEST(DataCheckDataset, MessyDatasetExactSummary) {
  auto dir = make_messy_dataset();
  DatasetSpec spec = load_data_yaml(dir + "/data.yaml");
  CheckOptions opts;
  opts.workers = 2;
  opts.use_cache = false;
  DatasetIndex idx = build_split_index(spec, "train", opts);
  const auto& s = idx.summary;
  EXPECT_EQ(s.files, 17);
  EXPECT_EQ(s.images, 7);
  EXPECT_EQ(s.instances, 6);
  EXPECT_EQ(s.backgrounds, 2);
  EXPECT_EQ(s.missing_labels, 1);
  EXPECT_EQ(s.duplicates_removed, 1);
  EXPECT_EQ(s.polygons_converted, 1);
  const std::map<std::string, int64_t> expected = {
      {"image_corrupt", 1},    {"image_too_small", 1}, {"unknown_format", 1},
      {"label_arity", 2},      {"label_class", 1},     {"label_out_of_range", 1},
      {"label_non_finite", 1}, {"label_size", 1},      {"image_truncated", 1}};
  EXPECT_EQ(s.skipped, expected);
  EXPECT_EQ(s.skipped_total(), 10);
  EXPECT_EQ(idx.issues.size(), 14u);  // 11 row/file problems + duplicate, polygon and end-marker notes
  const auto issue_of = [&](Problem problem) {
    return std::find_if(idx.issues.begin(), idx.issues.end(), [&](const Issue& i) { return i.problem == problem; });
  };
  ASSERT_NE(issue_of(Problem::kJpegEndMarkerMissing), idx.issues.end());
  EXPECT_EQ(issue_of(Problem::kJpegEndMarkerMissing)->file, dir + "/images/train/no_end_marker.jpg");
  ASSERT_NE(issue_of(Problem::kImageTruncated), idx.issues.end());
  EXPECT_EQ(issue_of(Problem::kImageTruncated)->file, dir + "/images/train/truncated.jpg");
  EXPECT_TRUE(std::none_of(idx.records.begin(), idx.records.end(),
                           [](const ImageRecord& r) { return r.image.find("truncated.jpg") != std::string::npos; }));

  // Problems carry file and line.
  bool saw_multi_line3 = false;
  for (const auto& i : idx.issues)
    if (i.file == dir + "/labels/train/multi.txt" && i.line == 3 && i.problem == Problem::kLabelClass)
      saw_multi_line3 = true;
  EXPECT_TRUE(saw_multi_line3);

  // Polygon converted to its bounding box; in-tolerance coordinate clamped.
  for (const auto& r : idx.records) {
    if (r.image.find("poly.png") != std::string::npos) {
      ASSERT_EQ(r.boxes.size(), 1u);
      EXPECT_NEAR(r.boxes[0].cx, 0.25, 1e-6);
      EXPECT_NEAR(r.boxes[0].cy, 0.3, 1e-6);
      EXPECT_NEAR(r.boxes[0].w, 0.3, 1e-6);
      EXPECT_NEAR(r.boxes[0].h, 0.4, 1e-6);
    }
    if (r.image.find("tol.png") != std::string::npos) {
      EXPECT_FLOAT_EQ(r.boxes.at(0).cx, 1.0f);
    }
    if (r.image.find("good.jpg") != std::string::npos) {
      EXPECT_EQ(r.width, 64);
      EXPECT_EQ(r.height, 48);
    }
  }
  std::ostringstream os;
  EXPECT_TRUE(check_dataset(dir + "/data.yaml", os, 2, false));
  EXPECT_NE(os.str().find("7 images"), std::string::npos) << os.str();
  EXPECT_NE(os.str().find("multi.txt:2"), std::string::npos) << os.str();
}

TEST(DataCheckDataset, NothingUsableReturnsFalse) {
  auto dir = scratch_dir("all_bad");
  write_text(dir + "/images/train/a.jpg", "garbage");
  write_image(dir + "/images/train/b.png", 5, 5);
  write_text(dir + "/data.yaml", "train: images/train\nval: images/train\nnames: [a]\n");
  std::ostringstream os;
  EXPECT_FALSE(check_dataset(dir + "/data.yaml", os, 1, false));
  EXPECT_NE(os.str().find("no usable images"), std::string::npos);
}

TEST(DataCheckDataset, TxtListWithMissingImage) {
  auto dir = scratch_dir("txt_missing");
  write_image(dir + "/images/a.png", 20, 20);
  write_text(dir + "/val.txt", "images/a.png\nimages/gone.png\n");
  write_text(dir + "/data.yaml", "train: val.txt\nval: val.txt\nnames: [a]\n");
  DatasetIndex idx = build_split_index(load_data_yaml(dir + "/data.yaml"), "val", no_cache());
  EXPECT_EQ(idx.summary.images, 1);
  EXPECT_EQ(idx.summary.skipped.at("image_missing"), 1);
  // Listed splits over one folder keep separate caches.
  CheckOptions cached;
  cached.cache_dir = scratch_dir("cache");
  const DatasetIndex val = build_split_index(load_data_yaml(dir + "/data.yaml"), "val", cached);
  EXPECT_TRUE(fs::exists(val.cache_path));
  EXPECT_NE(val.cache_path.find("labels.val-"), std::string::npos) << val.cache_path;
  EXPECT_TRUE(build_split_index(load_data_yaml(dir + "/data.yaml"), "val", cached).from_cache);
  EXPECT_FALSE(build_split_index(load_data_yaml(dir + "/data.yaml"), "train", cached).from_cache);
}

TEST(DataCheckDataset, LabelsBesideImages) {
  auto dir = scratch_dir("flat");
  write_image(dir + "/flat/a.png", 20, 20);
  write_text(dir + "/flat/a.txt", "0 0.5 0.5 0.5 0.5\n");
  write_text(dir + "/data.yaml", "train: flat\nnames: [a]\n");
  DatasetIndex idx = build_split_index(load_data_yaml(dir + "/data.yaml"), "train", no_cache());
  EXPECT_EQ(idx.summary.files, 1);
  EXPECT_EQ(idx.summary.instances, 1);
  EXPECT_EQ(idx.summary.skipped_total(), 0);
}

TEST(DataCheckDataset, CacheHitAndInvalidation) {
  auto dir = make_messy_dataset();
  DatasetSpec spec = load_data_yaml(dir + "/data.yaml");
  CheckOptions opts;
  opts.workers = 2;
  opts.cache_dir = scratch_dir("cache");
  DatasetIndex a = build_split_index(spec, "train", opts);
  EXPECT_FALSE(a.from_cache);
  EXPECT_EQ(fs::path(a.cache_path).parent_path(), fs::path(opts.cache_dir) / "datasets");
  EXPECT_TRUE(fs::exists(a.cache_path));
  DatasetIndex b = build_split_index(spec, "train", opts);
  EXPECT_TRUE(b.from_cache);
  EXPECT_EQ(b.summary.images, a.summary.images);
  EXPECT_EQ(b.summary.skipped, a.summary.skipped);
  EXPECT_EQ(b.issues.size(), a.issues.size());
  ASSERT_EQ(b.records.size(), a.records.size());
  for (size_t i = 0; i < a.records.size(); ++i) {
    EXPECT_EQ(b.records[i].image, a.records[i].image);
    EXPECT_EQ(b.records[i].boxes.size(), a.records[i].boxes.size());
  }
  // A changed label file (size and mtime) invalidates the cache.
  write_text(dir + "/labels/train/arity.txt", "0 0.5 0.5 0.2 0.2\n");
  DatasetIndex c = build_split_index(spec, "train", opts);
  EXPECT_FALSE(c.from_cache);
  EXPECT_EQ(c.summary.images, 8);
  EXPECT_EQ(c.summary.skipped.at("label_arity"), 1);
  // So does a new label file for a background image.
  write_text(dir + "/labels/train/bg_missing.txt", "1 0.5 0.5 0.5 0.5\n");
  DatasetIndex d = build_split_index(spec, "train", opts);
  EXPECT_FALSE(d.from_cache);
  EXPECT_EQ(d.summary.missing_labels, 0);
}

// Ultralytics reads `labels/<split>.cache` as its own pickle and crashes on anything else: indexing a dataset
// (with the cache on, in the default folder) leaves the dataset folder exactly as it was.
TEST(DataCheckDataset, IndexingWritesNothingIntoTheDataset) {
  auto dir = make_messy_dataset();
  const auto listing = [&] {
    std::vector<std::string> files;
    for (const auto& entry : fs::recursive_directory_iterator(dir)) files.push_back(entry.path().string());
    std::sort(files.begin(), files.end());
    return files;
  };
  const std::vector<std::string> before = listing();
  CheckOptions opts;
  opts.workers = 2;
  const DatasetIndex index = build_split_index(load_data_yaml(dir + "/data.yaml"), "train", opts);
  EXPECT_TRUE(fs::exists(index.cache_path));
  EXPECT_EQ(index.cache_path.rfind(fs::path(dir).string(), 0), std::string::npos) << index.cache_path;
  EXPECT_EQ(listing(), before);
  for (const auto& file : listing()) EXPECT_NE(fs::path(file).extension(), ".cache") << file;
}

TEST(DataCheckDataset, DefaultCacheFolderFollowsTheEnvironment) {
  const auto saved = [](const char* name) {
    const char* value = std::getenv(name);
    return std::make_pair(value != nullptr, std::string(value != nullptr ? value : ""));
  };
  const auto restore = [](const char* name, const std::pair<bool, std::string>& value) {
    if (value.first) {
      ::setenv(name, value.second.c_str(), 1);
    } else {
      ::unsetenv(name);
    }
  };
  const auto yolo8_dir = saved("YOLO8_CACHE_DIR"), xdg = saved("XDG_CACHE_HOME"), home = saved("HOME");
  ::setenv("YOLO8_CACHE_DIR", "/somewhere/yolo8", 1);
  ::setenv("XDG_CACHE_HOME", "/xdg", 1);
  EXPECT_EQ(default_cache_dir(), "/somewhere/yolo8");
  ::unsetenv("YOLO8_CACHE_DIR");
  EXPECT_EQ(default_cache_dir(), "/xdg/yolo8");
  ::unsetenv("XDG_CACHE_HOME");
  ::setenv("HOME", "/home/ada", 1);
  EXPECT_EQ(default_cache_dir(), "/home/ada/.cache/yolo8");
  restore("YOLO8_CACHE_DIR", yolo8_dir);
  restore("XDG_CACHE_HOME", xdg);
  restore("HOME", home);
}

}  // namespace
}  // namespace yolo8::data
