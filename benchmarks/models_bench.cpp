// YOLOv8 model costs on this machine: forward latency (unfused vs fused, eval vs train) and weight
// loading (native Ultralytics .pt reader vs torch::pickle_load state dict). Ratios come from one run.
// Usage: models_bench [--fixtures DIR] [--json PATH] [--iters N] [--imgsz S]
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "models/model_info.h"
#include "models/weights.h"

namespace {

double median_ms(const std::function<void()>& fn, int iters, int warmup = 1) {
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  using namespace yolo8;
  std::string fixtures = "tests/fixtures", json_path = "models_bench.json";
  int iters = 5;
  int64_t imgsz = 640;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--fixtures")
      fixtures = argv[i + 1];
    else if (a == "--json")
      json_path = argv[i + 1];
    else if (a == "--iters")
      iters = std::max(1, std::atoi(argv[i + 1]));
    else if (a == "--imgsz")
      imgsz = std::atoll(argv[i + 1]);
    else {
      std::cerr << "unknown argument " << a << "\n";
      return 2;
    }
  }
  try {
    torch::manual_seed(0);
    nlohmann::json rows = nlohmann::json::array();
    std::printf("%-8s %-22s %10s %10s\n", "model", "case", "ms", "GFLOPs");
    for (const std::string scale : {"n", "s"}) {
      auto model = build_model("yolov8" + scale + ".yaml", 80);
      const double gflops = model_gflops(model, imgsz, imgsz);
      const auto x = torch::rand({1, 3, imgsz, imgsz});
      torch::NoGradGuard no_grad;
      auto fused = copy_model(model);
      fused->eval();
      fused->fuse();
      // Interleaved so that load changes on a shared machine hit all three cases alike.
      std::vector<double> e, t, f;
      auto once = [](const std::function<void()>& fn) {
        const auto t0 = std::chrono::steady_clock::now();
        fn();
        return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      };
      for (int i = 0; i <= iters; ++i) {
        model->eval();
        const double a = once([&] { model->forward(x); });
        model->train();
        const double b = once([&] { model->forward_maps(x); });
        const double c = once([&] { fused->forward(x); });
        if (i == 0) continue;  // warm-up
        e.push_back(a);
        t.push_back(b);
        f.push_back(c);
      }
      auto median = [](std::vector<double> v) {
        std::sort(v.begin(), v.end());
        return v[v.size() / 2];
      };
      const double eval_ms = median(e), train_ms = median(t), fused_ms = median(f);
      for (const auto& [name, ms] : std::vector<std::pair<std::string, double>>{
               {"eval", eval_ms}, {"train-mode forward", train_ms}, {"eval fused", fused_ms}}) {
        std::printf("%-8s %-22s %10.1f %10.1f\n", ("yolov8" + scale).c_str(), name.c_str(), ms, gflops);
        rows.push_back({{"model", "yolov8" + scale}, {"case", name}, {"ms", ms}, {"gflops", gflops}});
      }
      const double ratio = eval_ms / fused_ms;
      std::printf("%-8s %-22s %10.2f\n", ("yolov8" + scale).c_str(), "unfused/fused ratio", ratio);
      rows.push_back({{"model", "yolov8" + scale}, {"case", "unfused_over_fused"}, {"ratio", ratio}});
    }
    const std::string pt = fixtures + "/yolov8n-shapes.pt", sd = fixtures + "/yolov8n-shapes.state_dict.pt";
    const double pt_read_ms = median_ms([&] { read_ultralytics_checkpoint(pt); }, iters);
    const double pt_ms = median_ms([&] { load_model(pt); }, iters);
    const double sd_ms = median_ms([&] { load_model(sd); }, iters);
    std::printf("%-8s %-22s %10.1f\n", "yolov8n", "read .pt (no build)", pt_read_ms);
    std::printf("%-8s %-22s %10.1f\n", "yolov8n", "load_model .pt", pt_ms);
    std::printf("%-8s %-22s %10.1f\n", "yolov8n", "load_model state_dict", sd_ms);
    std::printf("%-8s %-22s %10.2f\n", "yolov8n", ".pt/state_dict ratio", pt_ms / sd_ms);
    rows.push_back({{"model", "yolov8n"}, {"case", "read_pt"}, {"ms", pt_read_ms}});
    rows.push_back({{"model", "yolov8n"}, {"case", "load_model_pt"}, {"ms", pt_ms}});
    rows.push_back({{"model", "yolov8n"}, {"case", "load_model_state_dict"}, {"ms", sd_ms}});
    rows.push_back({{"model", "yolov8n"}, {"case", "pt_over_state_dict"}, {"ratio", pt_ms / sd_ms}});
    nlohmann::json out{{"benchmark", "models_bench"},
                       {"imgsz", imgsz},
                       {"iters", iters},
                       {"threads", torch::get_num_threads()},
                       {"rows", rows}};
    std::ofstream(json_path) << out.dump(2) << "\n";
    std::printf("wrote %s\n", json_path.c_str());
  } catch (const std::exception& e) {
    std::cerr << "models_bench: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
