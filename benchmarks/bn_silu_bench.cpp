// The fused BatchNorm+SiLU training pass against ATen's BatchNorm2d + SiLU, on yolov8n's activation shapes at
// 160 px, batch 16 (channels-last; float32, and bfloat16 as under CPU autocast where the CPU has the bfloat16 loops),
// with 1 and 2 threads: forward and backward milliseconds and their ratio.
// Usage: bn_silu_bench [--reps N (timed passes, default 10)] [--json PATH]
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "models/blocks.h"
#include "models/bn_silu.h"

namespace {
using Clock = std::chrono::steady_clock;

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 10;
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--reps" && i + 1 < argc) reps = std::stoi(argv[++i]);
    if (arg == "--json" && i + 1 < argc) json_path = argv[++i];
  }
  const std::vector<std::vector<int64_t>> shapes = {{16, 16, 80, 80},  {16, 32, 80, 80},  {16, 64, 40, 40},
                                                    {16, 128, 20, 20}, {16, 256, 10, 10}, {16, 256, 5, 5}};
  nlohmann::json report = nlohmann::json::array();
  std::printf("%-8s %-7s %-18s %12s %12s %8s %12s %12s %8s\n", "dtype", "threads", "shape", "fwd ATen ms",
              "fwd fused ms", "ratio", "bwd ATen ms", "bwd fused ms", "ratio");
  std::vector<torch::ScalarType> dtypes = {torch::kFloat};
  if (yolo8::batch_norm_silu_supported(
          torch::zeros({1, 16, 1, 1}, torch::kBFloat16).contiguous(torch::MemoryFormat::ChannelsLast))) {
    dtypes.push_back(torch::kBFloat16);
  }
  for (const torch::ScalarType dtype : dtypes) {
    for (const int threads : {1, 2}) {
      torch::set_num_threads(threads);
      for (const auto& shape : shapes) {
        torch::manual_seed(0);
        const torch::Tensor x0 = torch::randn(shape).to(dtype).contiguous(torch::MemoryFormat::ChannelsLast);
        torch::nn::BatchNorm2d bn(
            torch::nn::BatchNorm2dOptions(shape[1]).eps(yolo8::kBnEps).momentum(yolo8::kBnMomentum));
        bn->train();
        double forward_ms[2] = {0, 0}, backward_ms[2] = {0, 0};
        // Two untimed passes warm the allocator and the caches; ATen and fused alternate, so drift hits both.
        for (int rep = 0; rep < reps + 2; ++rep) {
          for (int fused = 0; fused < 2; ++fused) {
            torch::Tensor x = x0.clone(torch::MemoryFormat::ChannelsLast).requires_grad_(true);
            const auto t0 = Clock::now();
            torch::Tensor y = fused ? yolo8::batch_norm_silu_train(x, bn->weight, bn->bias, bn->running_mean,
                                                                   bn->running_var, yolo8::kBnMomentum, yolo8::kBnEps)
                                    : torch::silu(bn->forward(x));
            const auto t1 = Clock::now();
            y.backward(torch::ones_like(y));
            const auto t2 = Clock::now();
            if (rep < 2) continue;
            forward_ms[fused] += ms_between(t0, t1) / reps;
            backward_ms[fused] += ms_between(t1, t2) / reps;
          }
        }
        const std::string name = std::to_string(shape[0]) + "x" + std::to_string(shape[1]) + "x" +
                                 std::to_string(shape[2]) + "x" + std::to_string(shape[3]);
        const char* dtype_name = dtype == torch::kFloat ? "float32" : "bfloat16";
        std::printf("%-8s %-7d %-18s %12.3f %12.3f %7.2fx %12.3f %12.3f %7.2fx\n", dtype_name, threads, name.c_str(),
                    forward_ms[0], forward_ms[1], forward_ms[0] / forward_ms[1], backward_ms[0], backward_ms[1],
                    backward_ms[0] / backward_ms[1]);
        report.push_back({{"dtype", dtype_name},
                          {"threads", threads},
                          {"shape", name},
                          {"forward_aten_ms", forward_ms[0]},
                          {"forward_fused_ms", forward_ms[1]},
                          {"backward_aten_ms", backward_ms[0]},
                          {"backward_fused_ms", backward_ms[1]}});
      }
    }
  }
  std::printf("ratio: ATen's time over the fused pass's (above 1: the fused pass is faster)\n");
  if (!json_path.empty()) std::ofstream(json_path) << report.dump(2) << "\n";
  return 0;
}
