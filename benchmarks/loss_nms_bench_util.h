#pragma once
// Small helpers shared by loss_bench and nms_bench: argument parsing, timing, JSON output.
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

namespace yolo8::bench {

struct Args {
  std::string json_path;
  int iters = 5;
  int warmup = 1;
  int threads = 0;  // 0: LibTorch default
};

inline Args parse_args(int argc, char** argv, const std::string& name) {
  Args a;
  a.json_path = "benchmarks/results/" + name + ".json";
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument("missing value after " + k);
      return argv[++i];
    };
    if (k == "--json") {
      a.json_path = value();
    } else if (k == "--iters") {
      a.iters = std::stoi(value());
    } else if (k == "--warmup") {
      a.warmup = std::stoi(value());
    } else if (k == "--threads") {
      a.threads = std::stoi(value());
    } else if (k == "--help" || k == "-h") {
      std::cout << "usage: " << name << " [--json PATH] [--iters N] [--warmup N] [--threads N]\n";
      std::exit(0);
    } else {
      throw std::invalid_argument("unknown argument " + k);
    }
  }
  if (a.iters < 1) throw std::invalid_argument("--iters must be >= 1");
  if (a.threads > 0) torch::set_num_threads(a.threads);
  return a;
}

struct Timing {
  double wall_ms = 0;  // median wall time
  double cpu_ms = 0;   // median process CPU time (all threads): steadier than wall time on a busy machine
};

inline Timing measure(const std::function<void()>& fn, int iters, int warmup) {
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<double> wall, cpu;
  for (int i = 0; i < iters; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    const auto c0 = std::clock();
    fn();
    cpu.push_back(1000.0 * static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC);
    wall.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(wall.begin(), wall.end());
  std::sort(cpu.begin(), cpu.end());
  return {wall[wall.size() / 2], cpu[cpu.size() / 2]};
}

inline void write_json(const std::string& path, const nlohmann::json& j) {
  const auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  std::ofstream out(path);
  if (!out) throw std::runtime_error("cannot write " + path);
  out << j.dump(2) << "\n";
  std::cout << "wrote " << path << "\n";
}

}  // namespace yolo8::bench
