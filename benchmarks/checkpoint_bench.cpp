// Cost of the recipe's per-step extras and of a checkpoint at yolov8n scale (3.2 M parameters):
// EMA update, encode, atomic write (with fsync) and load. Prints a table and writes JSON.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "trainer/core/atomic_file.h"
#include "trainer/core/checkpoint.h"
#include "trainer/core/ema.h"
#include "trainer/core/optimizer.h"
#include "trainer/core/schedule.h"

namespace {

// Conv / BN / bias tensors adding up to roughly yolov8n's parameter count.
struct NanoLikeImpl : torch::nn::Cloneable<NanoLikeImpl> {
  NanoLikeImpl() { reset(); }
  void reset() override {
    const std::vector<std::pair<int64_t, int64_t>> layers = {{16, 3},    {32, 16},   {64, 32},   {128, 64},
                                                             {256, 128}, {256, 256}, {128, 256}, {64, 128},
                                                             {256, 64},  {256, 256}, {256, 256}, {64, 256}};
    convs = register_module("convs", torch::nn::ModuleList());
    bns = register_module("bns", torch::nn::ModuleList());
    for (const auto& [out, in] : layers) {
      convs->push_back(torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 3).bias(false)));
      bns->push_back(torch::nn::BatchNorm2d(out));
    }
  }
  torch::nn::ModuleList convs{nullptr};
  torch::nn::ModuleList bns{nullptr};
};
TORCH_MODULE(NanoLike);

double time_ms(const std::function<void()>& f, int reps) {
  f();  // warm-up
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) f();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / reps;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string json_path = argc > 1 ? argv[1] : "checkpoint_bench.json";
  torch::manual_seed(0);
  NanoLike net;
  int64_t params = 0;
  for (const auto& p : net->parameters()) params += p.numel();
  yolo8::OptimSettings settings;
  settings.optimizer = "SGD";
  auto built = yolo8::build_optimizer(*net, settings, yolo8::RunShape{1000, 16, 10, 80});
  for (auto& p : net->parameters()) p.mutable_grad() = torch::randn_like(p);
  built.optimizer->step();  // momentum buffers exist
  auto ema = yolo8::ModelEma::clone_of(net.ptr());

  const std::string dir = (std::filesystem::temp_directory_path() / "yolo8_checkpoint_bench").string();
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/last.pt";
  yolo8::CheckpointState state;
  state.rng = yolo8::capture_torch_rng();
  const yolo8::CheckpointSources sources{net.get(), &ema, built.optimizer.get(), false};
  std::vector<char> bytes;

  struct Row {
    std::string name;
    double ms;
  };
  std::vector<Row> rows;
  rows.push_back({"ema_update", time_ms([&] { ema.update(*net); }, 50)});
  rows.push_back({"encode", time_ms([&] { bytes = yolo8::encode_checkpoint(state, sources); }, 5)});
  rows.push_back(
      {"write_atomic_fsync", time_ms([&] { yolo8::write_file_atomic(path, bytes.data(), bytes.size()); }, 5)});
  rows.push_back({"save_total", time_ms([&] { yolo8::save_checkpoint(path, state, sources); }, 5)});
  yolo8::CheckpointTargets targets;
  targets.model = net.get();
  targets.ema = &ema;
  targets.optimizer = built.optimizer.get();
  rows.push_back({"load_total", time_ms([&] { yolo8::load_checkpoint(path, targets); }, 5)});

  std::printf("checkpoint benchmark: %lld parameters, file %.1f MiB, %d intra-op threads\n",
              static_cast<long long>(params), bytes.size() / 1048576.0, torch::get_num_threads());
  std::printf("%-20s %10s %12s\n", "operation", "ms", "vs ema_update");
  for (const auto& r : rows) std::printf("%-20s %10.2f %12.1f\n", r.name.c_str(), r.ms, r.ms / rows[0].ms);
  std::ofstream out(json_path);
  out << "{\"parameters\": " << params << ", \"file_bytes\": " << bytes.size() << ", \"ms\": {";
  for (size_t i = 0; i < rows.size(); ++i) out << (i ? ", " : "") << "\"" << rows[i].name << "\": " << rows[i].ms;
  out << "}}\n";
  std::filesystem::remove_all(dir);
  return 0;
}
