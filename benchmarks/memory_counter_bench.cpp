// Cost of the instrumented CPU allocator: allocation throughput and a small conv-net training step,
// with and without the counter, measured alternately in one run. Prints a table and writes JSON.
//   memory_counter_bench [out.json]

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "trainer/core/memory_meter.h"

namespace {

struct ConvNetImpl : torch::nn::Module {
  ConvNetImpl()
      : c1(register_module("c1", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 32, 3).padding(1)))),
        c2(register_module("c2", torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 64, 3).stride(2).padding(1)))),
        c3(register_module("c3", torch::nn::Conv2d(torch::nn::Conv2dOptions(64, 128, 3).stride(2).padding(1)))) {}
  // x: [B, 3, H, W] -> [B]
  torch::Tensor forward(const torch::Tensor& x) {
    return torch::silu(c3->forward(torch::silu(c2->forward(torch::silu(c1->forward(x)))))).mean({1, 2, 3});
  }
  torch::nn::Conv2d c1, c2, c3;
};
TORCH_MODULE(ConvNet);

double seconds_of(const std::function<void()>& fn) {
  const auto start = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Median over rounds, alternating plain and counted so drifting machine load hits both alike.
std::pair<double, double> plain_and_counted(const std::function<void()>& work, int rounds) {
  std::vector<double> plain;
  std::vector<double> counted;
  for (int r = 0; r < rounds; ++r) {
    yolo8::uninstall_cpu_memory_counter();
    plain.push_back(seconds_of(work));
    yolo8::install_cpu_memory_counter();
    counted.push_back(seconds_of(work));
  }
  std::sort(plain.begin(), plain.end());
  std::sort(counted.begin(), counted.end());
  return {plain[plain.size() / 2], counted[counted.size() / 2]};
}

}  // namespace

int main(int argc, char** argv) {
  const std::string out_path = argc > 1 ? argv[1] : "memory_counter_bench.json";
  torch::manual_seed(0);
  nlohmann::json results = nlohmann::json::array();
  std::printf("%-28s %14s %14s %8s\n", "case", "plain", "counted", "ratio");

  for (const int64_t bytes : {int64_t{4096}, int64_t{1} << 20}) {
    const int count = 20000;
    auto work = [&] {
      for (int i = 0; i < count; ++i) {
        torch::Tensor t = torch::empty({bytes}, torch::kUInt8);
      }
    };
    work();
    const auto [plain, counted] = plain_and_counted(work, 7);
    const std::string name = "alloc+free " + std::to_string(bytes) + " B";
    std::printf("%-28s %11.1f ns %11.1f ns %8.3f\n", name.c_str(), plain / count * 1e9, counted / count * 1e9,
                counted / plain);
    results.push_back({{"case", name},
                       {"plain_ns", plain / count * 1e9},
                       {"counted_ns", counted / count * 1e9},
                       {"ratio", counted / plain}});
  }

  ConvNet net;
  torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  const torch::Tensor x = torch::randn({8, 3, 96, 96});
  auto step = [&] {
    optimizer.zero_grad();
    net->forward(x).sum().backward();
    optimizer.step();
  };
  step();
  const auto [plain, counted] = plain_and_counted(step, 9);
  std::printf("%-28s %11.2f ms %11.2f ms %8.3f\n", "conv train step b8 96px", plain * 1e3, counted * 1e3,
              counted / plain);
  results.push_back({{"case", "conv train step b8 96px"},
                     {"plain_ms", plain * 1e3},
                     {"counted_ms", counted * 1e3},
                     {"ratio", counted / plain}});

  std::ofstream(out_path) << results.dump(2) << "\n";
  std::printf("wrote %s\n", out_path.c_str());
  return 0;
}
