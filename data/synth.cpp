#include "data/synth.h"

#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <thread>

#include "data/augment.h"

namespace yolo8::data {
namespace fs = std::filesystem;

const std::vector<std::string>& synth_class_names() {
  static const std::vector<std::string> kNames = {"circle", "rectangle", "triangle", "scratch", "stain"};
  return kNames;
}

namespace {

// Anti-aliased edges and rounded centres reach about a pixel past the geometric outline.
constexpr double kAaMargin = 1.0;

struct Obj {
  int cls;
  cv::Rect2d box;
};

// Smooth low-frequency shading plus fine grain, so the background is textured but never object-like.
cv::Mat background(int h, int w, Rng& rng, cv::RNG& cvr) {
  const double base = rng.uniform(80, 170);
  cv::Mat small(6, 6, CV_32FC3);
  cvr.fill(small, cv::RNG::UNIFORM, cv::Scalar::all(-25), cv::Scalar::all(25));
  cv::Mat shade;
  cv::resize(small, shade, cv::Size(w, h), 0, 0, cv::INTER_CUBIC);
  const cv::Scalar tint(base + rng.uniform(-15, 15), base + rng.uniform(-15, 15), base + rng.uniform(-15, 15));
  cv::Mat grain(h, w, CV_32FC3);
  cvr.fill(grain, cv::RNG::NORMAL, cv::Scalar::all(0), cv::Scalar::all(6));
  cv::Mat f = shade + grain + tint;
  cv::Mat out;
  f.convertTo(out, CV_8UC3);
  return out;
}

// Class colour families keep the task learnable in minutes; jitter keeps it from being trivial.
cv::Scalar class_colour(int cls, Rng& rng) {
  auto j = [&](double v) { return std::clamp(v + rng.uniform(-25, 25), 0.0, 255.0); };
  switch (cls) {
    case 0: return {j(40), j(40), j(220)};   // circle: red (BGR)
    case 1: return {j(220), j(60), j(30)};   // rectangle: blue
    case 2: return {j(40), j(200), j(40)};   // triangle: green
    case 3: return {j(25), j(25), j(25)};    // scratch: dark
    default: return {j(30), j(70), j(110)};  // stain: brown
  }
}

cv::Rect2d draw_object(cv::Mat& img, int cls, double cx, double cy, double size, Rng& rng) {
  const cv::Scalar col = class_colour(cls, rng);
  const double img_w = img.cols, img_h = img.rows;
  auto clip = [&](double x0, double y0, double x1, double y1) {
    x0 = std::clamp(x0, 0.0, img_w);
    x1 = std::clamp(x1, 0.0, img_w);
    y0 = std::clamp(y0, 0.0, img_h);
    y1 = std::clamp(y1, 0.0, img_h);
    return cv::Rect2d(x0, y0, x1 - x0, y1 - y0);
  };
  if (cls == 0) {
    const double r = size / 2;
    cv::circle(img, cv::Point(cvRound(cx), cvRound(cy)), cvRound(r), col, cv::FILLED, cv::LINE_AA);
    return clip(cx - r - kAaMargin, cy - r - kAaMargin, cx + r + kAaMargin, cy + r + kAaMargin);
  }
  if (cls == 1) {
    const double ar = rng.uniform(0.55, 1.8);
    const double w = size * std::sqrt(ar), h = size / std::sqrt(ar);
    cv::rectangle(img, cv::Point(cvRound(cx - w / 2), cvRound(cy - h / 2)),
                  cv::Point(cvRound(cx + w / 2), cvRound(cy + h / 2)), col, cv::FILLED, cv::LINE_AA);
    return clip(cvRound(cx - w / 2), cvRound(cy - h / 2), cvRound(cx + w / 2) + 1, cvRound(cy + h / 2) + 1);
  }
  if (cls == 2) {
    const double a0 = rng.uniform(0, 2 * CV_PI);
    std::vector<cv::Point> pts;
    for (int k = 0; k < 3; ++k) {
      const double a = a0 + k * 2 * CV_PI / 3 + rng.uniform(-0.25, 0.25);
      pts.emplace_back(cvRound(cx + size / 2 * std::cos(a)), cvRound(cy + size / 2 * std::sin(a)));
    }
    cv::fillConvexPoly(img, pts, col, cv::LINE_AA);
    cv::Rect b = cv::boundingRect(pts);
    return clip(b.x - kAaMargin, b.y - kAaMargin, b.x + b.width + kAaMargin, b.y + b.height + kAaMargin);
  }
  if (cls == 3) {
    // Scratch: a thin, slightly bent stroke across the object's box.
    const double a = rng.uniform(0, CV_PI);
    const double half = size / 2;
    const int thick = std::max(2, cvRound(size * 0.06));
    cv::Point p0(cvRound(cx - half * std::cos(a)), cvRound(cy - half * std::sin(a)));
    cv::Point p2(cvRound(cx + half * std::cos(a)), cvRound(cy + half * std::sin(a)));
    cv::Point p1(cvRound(cx + rng.uniform(-0.12, 0.12) * size), cvRound(cy + rng.uniform(-0.12, 0.12) * size));
    std::vector<cv::Point> pts = {p0, p1, p2};
    cv::polylines(img, pts, false, col, thick, cv::LINE_AA);
    cv::Rect b = cv::boundingRect(pts);
    const double t = thick / 2.0 + 1;
    return clip(b.x - t, b.y - t, b.x + b.width + t, b.y + b.height + t);
  }
  // Stain: overlapping translucent blobs.
  cv::Mat layer = img.clone();
  double x0 = 1e9, y0 = 1e9, x1 = -1e9, y1 = -1e9;
  for (int k = 0; k < 4; ++k) {
    const double ox = cx + rng.uniform(-0.2, 0.2) * size, oy = cy + rng.uniform(-0.2, 0.2) * size;
    const double ax = rng.uniform(0.15, 0.3) * size, ay = rng.uniform(0.15, 0.3) * size;
    cv::ellipse(layer, cv::Point(cvRound(ox), cvRound(oy)), cv::Size(cvRound(ax), cvRound(ay)), 0, 0, 360, col,
                cv::FILLED, cv::LINE_AA);
    x0 = std::min(x0, ox - ax);
    x1 = std::max(x1, ox + ax);
    y0 = std::min(y0, oy - ay);
    y1 = std::max(y1, oy + ay);
  }
  cv::addWeighted(layer, 0.8, img, 0.2, 0, img);
  return clip(x0 - 1.5 * kAaMargin, y0 - 1.5 * kAaMargin, x1 + 1.5 * kAaMargin, y1 + 1.5 * kAaMargin);
}

int64_t make_image(const std::string& img_path, const std::string& lbl_path, int imgsz, uint64_t seed) {
  Rng rng(seed);
  cv::RNG cvr(seed);
  const int w = rng.chance(0.5) ? imgsz : 2 * cvRound(imgsz * rng.uniform(0.75, 1.0) / 2);
  const int h = w != imgsz ? imgsz : 2 * cvRound(imgsz * rng.uniform(0.75, 1.0) / 2);
  cv::Mat img = background(h, w, rng, cvr);
  const int n_obj = rng.chance(0.05) ? 0 : 1 + static_cast<int>(rng.randint(4));
  std::vector<Obj> objs;
  const double side = std::min(w, h);
  for (int k = 0; k < n_obj; ++k) {
    for (int attempt = 0; attempt < 30; ++attempt) {
      const int cls = static_cast<int>(rng.randint(5));
      const double size = side * rng.uniform(0.15, 0.38);
      const double cx = rng.uniform(size / 2, w - size / 2), cy = rng.uniform(size / 2, h - size / 2);
      cv::Rect2d guess(cx - size * 0.6, cy - size * 0.6, size * 1.2, size * 1.2);
      bool free = std::all_of(objs.begin(), objs.end(), [&](const Obj& o) { return (o.box & guess).area() <= 0; });
      if (!free) continue;
      cv::Rect2d b = draw_object(img, cls, cx, cy, size, rng);
      if (b.width > 1 && b.height > 1) objs.push_back({cls, b});
      break;
    }
  }
  if (!cv::imwrite(img_path, img, {cv::IMWRITE_JPEG_QUALITY, 95}))
    throw std::runtime_error(img_path + ": cannot write image");
  std::ofstream lf(lbl_path);
  if (!lf) throw std::runtime_error(lbl_path + ": cannot write label file");
  char row[128];
  for (const auto& o : objs) {
    std::snprintf(row, sizeof row, "%d %.6f %.6f %.6f %.6f\n", o.cls, (o.box.x + o.box.width / 2) / w,
                  (o.box.y + o.box.height / 2) / h, o.box.width / w, o.box.height / h);
    lf << row;
  }
  return static_cast<int64_t>(objs.size());
}

// Files of an earlier synth run (its numbered images, labels, caches) would mix into this one.
void remove_previous_run(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return;
  std::vector<fs::path> stale;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    const bool numbered = name.size() >= 10 &&
                          std::all_of(name.begin(), name.begin() + 6, [](char c) { return c >= '0' && c <= '9'; }) &&
                          name[6] == '.';
    if (e.is_regular_file() && numbered) stale.push_back(e.path());
  }
  for (const auto& p : stale) fs::remove(p, ec);
}

int64_t make_split(const fs::path& out, const std::string& split, int n, int imgsz, uint64_t seed, uint64_t split_id) {
  remove_previous_run(out / "images" / split);
  remove_previous_run(out / "labels" / split);
  std::error_code ec;
  fs::remove(out / "labels" / (split + ".cache"), ec);
  fs::create_directories(out / "images" / split);
  fs::create_directories(out / "labels" / split);
  std::vector<int64_t> counts(static_cast<size_t>(n), 0);
  std::atomic<int> next{0};
  auto work = [&] {
    for (int i = next++; i < n; i = next++) {
      char name[32];
      std::snprintf(name, sizeof name, "%06d", i);
      counts[static_cast<size_t>(i)] = make_image((out / "images" / split / (std::string(name) + ".jpg")).string(),
                                                  (out / "labels" / split / (std::string(name) + ".txt")).string(),
                                                  imgsz, Rng::mix(seed, split_id, static_cast<uint64_t>(i)));
    }
  };
  const int threads = static_cast<int>(std::min(4u, std::max(1u, std::thread::hardware_concurrency())));
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  int64_t total = 0;
  for (auto c : counts) total += c;
  return total;
}

}  // namespace

SynthResult synthesize_dataset(const std::string& out_dir, int n_train, int n_val, int imgsz, uint64_t seed) {
  if (out_dir.empty()) throw std::invalid_argument("out: output folder required");
  if (n_train < 0) throw std::invalid_argument("train: must be >= 0");
  if (n_val < 0) throw std::invalid_argument("val: must be >= 0");
  if (n_train + n_val == 0) throw std::invalid_argument("train/val: at least one image required");
  if (imgsz < 32 || imgsz > 4096) throw std::invalid_argument("imgsz: must be in [32, 4096]");
  const fs::path out = fs::absolute(out_dir).lexically_normal();
  SynthResult r;
  r.names = synth_class_names();
  if (n_train > 0) r.train_instances = make_split(out, "train", n_train, imgsz, seed, 1);
  if (n_val > 0) r.val_instances = make_split(out, "val", n_val, imgsz, seed, 2);
  r.train_images = n_train;
  r.val_images = n_val;
  r.yaml_path = (out / "data.yaml").string();
  std::ofstream y(r.yaml_path);
  if (!y) throw std::runtime_error(r.yaml_path + ": cannot write");
  y << "# Synthetic dataset written by yolo8 data synth (seed " << seed << ", imgsz " << imgsz << ")\n";
  std::string quoted = out.string();
  for (size_t p = quoted.find('\''); p != std::string::npos; p = quoted.find('\'', p + 2)) quoted.insert(p, "'");
  y << "path: '" << quoted << "'\n";
  y << "train: " << (n_train > 0 ? "images/train" : "images/val") << "\n";
  y << "val: " << (n_val > 0 ? "images/val" : "images/train") << "\n";
  y << "names:\n";
  for (size_t i = 0; i < r.names.size(); ++i) y << "  " << i << ": " << r.names[i] << "\n";
  return r;
}

}  // namespace yolo8::data
