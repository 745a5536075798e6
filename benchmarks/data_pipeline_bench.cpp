// Augmented training images/s of the data pipeline (mosaic, perspective, HSV, flips, batch tensors) on a synthetic
// set, for imgsz 640 and 320 and 1 / 2 worker threads, plus a per-stage profile on one thread.
// Usage: data_pipeline_bench [--json PATH] [--images N] [--epochs E] [--dir DIR] [--cache none|ram]
#include <sys/resource.h>

#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "data/image_io.h"
#include "data/loader.h"
#include "data/pixel_kernels.h"
#include "data/synth.h"

namespace {
using Clock = std::chrono::steady_clock;
using namespace yolo8::data;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// CPU seconds of the whole process: per-core throughput that other jobs on the machine cannot skew.
double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

struct Row {
  int imgsz, workers;
  std::string cache;
  double images_per_s, per_core, per_cpu_s;
};

// CPU time of the calling thread, so the stage profile ignores other jobs on the machine.
double thread_cpu() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

// Stage costs in CPU ms per training image on one thread (what a worker spends).
std::vector<std::pair<std::string, double>> profile(const DatasetIndex& idx, int imgsz, int n) {
  AugmentConfig aug;
  std::vector<std::pair<std::string, double>> out;
  std::vector<cv::Mat> imgs;
  std::vector<std::vector<PixBox>> boxes(4);
  double t0 = thread_cpu();
  // Both decoders timed the same way (result dropped, so no page faults for fresh memory), then kept for the stages.
  for (int i = 0; i < n; ++i) read_image(idx.records[i % idx.records.size()].image);
  out.emplace_back("decode (read_image)", (thread_cpu() - t0) * 1e3 / n);
  t0 = thread_cpu();
  for (int i = 0; i < n; ++i) cv::imread(idx.records[i % idx.records.size()].image, cv::IMREAD_COLOR);
  out.emplace_back("[for comparison] cv::imread", (thread_cpu() - t0) * 1e3 / n);
  std::vector<cv::Mat> raw;
  for (int i = 0; i < n; ++i) raw.push_back(read_image(idx.records[i % idx.records.size()].image));
  t0 = thread_cpu();
  for (int i = 0; i < n; ++i) imgs.push_back(resize_long_side(raw[i], imgsz));
  out.emplace_back("resize long side", (thread_cpu() - t0) * 1e3 / n);
  Rng rng(1);
  cv::Mat canvas, warped;
  std::vector<PixBox> bx;
  double t_fused = 0, t_general = 0, t_mosaic = 0, t_warp = 0, t_hsv = 0, t_hsv_recipe = 0, t_tensor = 0;
  cv::Mat hsv_input, hsv_work;
  uint8_t lut[768];
  for (int x = 0; x < 256; ++x) {
    lut[x] = static_cast<uint8_t>(x * 179 / 255);
    lut[256 + x] = static_cast<uint8_t>(255 - x);
    lut[512 + x] = static_cast<uint8_t>(x / 2);
  }
  // The same draws with a rotation too small to see: the general warpAffine path instead of the resize.
  AugmentConfig rotated = aug;
  rotated.degrees = 1e-6;
  cv::Mat warped_general;
  std::vector<PixBox> bx_general;
  torch::Tensor dst = torch::empty({3, imgsz, imgsz}, torch::kUInt8);
  for (int i = 0; i < n; ++i) {
    Tile tiles[4];
    for (int t = 0; t < 4; ++t) tiles[t] = {&imgs[(i + t) % n], &boxes[t]};
    // The loader's path: the fused mosaic + warp; the separate steps are timed for comparison.
    double t1 = thread_cpu();
    mosaic_perspective(tiles, imgsz, aug, rng, canvas, warped, bx, (i & 1) != 0);
    t_fused += (thread_cpu() - t1);
    Rng rng_general(static_cast<uint64_t>(i));
    t1 = thread_cpu();
    mosaic_perspective(tiles, imgsz, rotated, rng_general, canvas, warped_general, bx_general, (i & 1) != 0);
    t_general += (thread_cpu() - t1);
    cv::Mat full, warped2;
    std::vector<PixBox> bx2;
    t1 = thread_cpu();
    mosaic4(tiles, imgsz, rng, full, bx2);
    t_mosaic += (thread_cpu() - t1);
    t1 = thread_cpu();
    random_perspective(full, bx2, aug, -imgsz / 2, rng, warped2, (i & 1) != 0);
    t_warp += (thread_cpu() - t1);
    // The unfused recipe on a copy of the same image first (cvtColor, three tables, cvtColor), for comparison.
    warped.copyTo(hsv_input);
    t1 = thread_cpu();
    cv::cvtColor(hsv_input, hsv_work, cv::COLOR_BGR2HSV);
    for (int r = 0; r < hsv_work.rows; ++r) {
      uint8_t* p = hsv_work.ptr<uint8_t>(r);
      for (int x = 0; x < hsv_work.cols; ++x, p += 3) {
        p[0] = lut[p[0]];
        p[1] = lut[256 + p[1]];
        p[2] = lut[512 + p[2]];
      }
    }
    cv::cvtColor(hsv_work, hsv_input, cv::COLOR_HSV2BGR);
    t_hsv_recipe += (thread_cpu() - t1);
    t1 = thread_cpu();
    augment_hsv(warped, aug.hsv_h, aug.hsv_s, aug.hsv_v, rng);
    t_hsv += (thread_cpu() - t1);
    t1 = thread_cpu();
    const size_t plane = static_cast<size_t>(imgsz) * imgsz;
    uint8_t* d = dst.data_ptr<uint8_t>();
    if (avx512_vbmi_supported()) {  // as the loader's copy_to_planes
      for (int r = 0; r < imgsz; ++r)
        split_rgb_avx512(warped.ptr<uint8_t>(r), imgsz, d + r * imgsz, d + plane + r * imgsz,
                         d + 2 * plane + r * imgsz);
    } else {
      cv::Mat planes[3] = {cv::Mat(imgsz, imgsz, CV_8UC1, d + 2 * plane), cv::Mat(imgsz, imgsz, CV_8UC1, d + plane),
                           cv::Mat(imgsz, imgsz, CV_8UC1, d)};
      cv::split(warped, planes);
    }
    t_tensor += (thread_cpu() - t1);
  }
  out.emplace_back("mosaic + perspective + flip (fused)", t_fused * 1e3 / n);
  out.emplace_back("HSV (augment_hsv)", t_hsv * 1e3 / n);
  out.emplace_back("to CHW RGB tensor", t_tensor * 1e3 / n);
  // Not part of the pipeline (summed apart by the caller): the unfused steps the fused one replaces.
  out.emplace_back("[for comparison] fused, general warpAffine", t_general * 1e3 / n);
  out.emplace_back("[for comparison] full mosaic canvas", t_mosaic * 1e3 / n);
  out.emplace_back("[for comparison] then its resize + flip", t_warp * 1e3 / n);
  out.emplace_back("[for comparison] HSV as cvtColor + tables", t_hsv_recipe * 1e3 / n);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path, dir = (std::filesystem::temp_directory_path() / "yolo8_data_bench").string();
  int n_images = 96, epochs = 2;
  CacheMode cache = CacheMode::kNone;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(a + ": value missing");
      return argv[++i];
    };
    if (a == "--json")
      json_path = val();
    else if (a == "--images")
      n_images = std::stoi(val());
    else if (a == "--epochs")
      epochs = std::stoi(val());
    else if (a == "--dir")
      dir = val();
    else if (a == "--cache")
      cache = parse_cache_mode(val());
    else {
      std::cerr << "unknown argument " << a << "\n";
      return 2;
    }
  }
  torch::set_num_threads(1);
  cv::setNumThreads(0);  // the loader's threads are the only parallelism
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  std::vector<Row> rows;
  struct Verify {
    int imgsz;
    double verify_ms, cached_ms;
    bool cache_hit;
  };
  std::vector<Verify> verify;
  std::vector<std::pair<int, std::vector<std::pair<std::string, double>>>> profiles;
  for (int imgsz : {640, 320}) {
    const std::string sub = dir + "/s" + std::to_string(imgsz);
    std::string yaml = sub + "/data.yaml";
    if (!std::filesystem::exists(yaml)) yaml = synthesize_dataset(sub, n_images, 1, imgsz, 0).yaml_path;
    CheckOptions co;
    // Verification cost: header size + reduced grayscale decode, one thread, then the cached index.
    co.workers = 1;
    co.use_cache = false;
    const DatasetSpec spec = load_data_yaml(yaml);
    double c0 = cpu_seconds();
    DatasetIndex fresh = build_split_index(spec, "train", co);
    const double verify_ms = (cpu_seconds() - c0) * 1e3 / std::max<int64_t>(1, fresh.summary.files);
    co.use_cache = true;
    co.workers = 2;
    build_split_index(spec, "train", co);  // writes the cache
    auto t0 = Clock::now();
    auto idx = std::make_shared<DatasetIndex>(build_split_index(spec, "train", co));
    const double cached_ms = seconds_since(t0) * 1e3 / std::max<size_t>(1, idx->records.size());
    verify.push_back({imgsz, verify_ms, cached_ms, idx->from_cache});
    profiles.emplace_back(imgsz, profile(*idx, imgsz, std::min<int>(64, static_cast<int>(idx->records.size()))));
    for (int workers : {1, 2}) {
      LoaderConfig cfg;
      cfg.imgsz = imgsz;
      cfg.batch = 16;
      cfg.workers = workers;
      cfg.cache = cache;
      DataLoader dl(idx, cfg, AugmentConfig{}, true);
      dl.start_epoch(0);  // warm-up epoch (page cache, allocator, RAM cache)
      while (dl.next()) {
      }
      int64_t images = 0;
      const auto pass_start = Clock::now();
      const double pass_cpu_start = cpu_seconds();
      for (int e = 1; e <= epochs; ++e) {
        dl.start_epoch(e);
        while (auto b = dl.next()) images += b->images.size(0);
      }
      const double ips = images / seconds_since(pass_start);
      const double per_cpu = images / (cpu_seconds() - pass_cpu_start);
      rows.push_back(
          {imgsz, dl.workers(), to_string(cache), ips, ips / std::min<unsigned>(dl.workers(), cores), per_cpu});
    }
  }

  std::printf("data pipeline: %d synthetic images, batch 16, cache %s, %u hardware threads\n", n_images,
              to_string(cache).c_str(), cores);
  std::printf("%-6s %-8s %-10s %-15s %-16s\n", "imgsz", "workers", "images/s", "per core (wall)", "per CPU-second");
  for (const auto& r : rows) {
    std::printf("%-6d %-8d %-10.1f %-15.1f %-16.1f\n", r.imgsz, r.workers, r.images_per_s, r.per_core, r.per_cpu_s);
  }
  // A peer's figure is only a ratio when measured here, now; Ultralytics is not run by this benchmark.
  std::printf("(our figures only: Ultralytics was not measured in this run; compare on one machine in one run)\n");
  for (const auto& [imgsz, stages] : profiles) {
    std::printf("stages at %d (CPU ms per image, one thread):\n", imgsz);
    double total = 0;
    for (const auto& [name, ms] : stages) {
      std::printf("  %-42s %7.3f\n", name.c_str(), ms);
      if (name[0] != '[') total += ms;
    }
    std::printf("  %-42s %7.3f\n", "total (pipeline)", total);
  }
  for (const auto& v : verify)
    std::printf("verify at %d: %.3f CPU ms per image (header + reduced decode), cached index %.4f ms per image%s\n",
                v.imgsz, v.verify_ms, v.cached_ms, v.cache_hit ? "" : " (cache MISSED)");
  if (!json_path.empty()) {
    std::ofstream j(json_path);
    j << "{\n  \"benchmark\": \"data_pipeline\",\n  \"images\": " << n_images << ",\n  \"cores\": " << cores
      << ",\n  \"results\": [\n";
    for (size_t i = 0; i < rows.size(); ++i) {
      const auto& r = rows[i];
      j << "    {\"imgsz\": " << r.imgsz << ", \"workers\": " << r.workers << ", \"cache\": \"" << r.cache
        << "\", \"images_per_s\": " << r.images_per_s << ", \"images_per_s_per_core\": " << r.per_core
        << ", \"images_per_cpu_second\": " << r.per_cpu_s << "}" << (i + 1 < rows.size() ? "," : "") << "\n";
    }
    j << "  ],\n  \"stages_ms\": {";
    for (size_t p = 0; p < profiles.size(); ++p) {
      j << (p ? ", " : "") << "\"" << profiles[p].first << "\": {";
      for (size_t s = 0; s < profiles[p].second.size(); ++s)
        j << (s ? ", " : "") << "\"" << profiles[p].second[s].first << "\": " << profiles[p].second[s].second;
      j << "}";
    }
    j << "},\n  \"verify_ms_per_image\": {";
    for (size_t v = 0; v < verify.size(); ++v)
      j << (v ? ", " : "") << "\"" << verify[v].imgsz << "\": {\"check\": " << verify[v].verify_ms
        << ", \"cached\": " << verify[v].cached_ms << "}";
    j << "}\n}\n";
  }
  return 0;
}
