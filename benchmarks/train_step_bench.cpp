// Bare training step of yolov8n on synthetic tensors, phase by phase: forward, loss, backward, optimizer.
// Usage: train_step_bench [imgsz=320] [batch=16] [steps=5] [model=yolov8n.yaml] [threads=0 (all cores)] [--json PATH]
// Compares contiguous vs channels-last layouts in one run (ratios, not absolute times, are the point).
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <thread>

#include "models/yolo.h"
#include "trainer/core/train_step.h"
#ifdef YOLO8_BENCH_HEAP_TUNING
#include "data/loader.h"
#endif

namespace {
using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

torch::Tensor synthetic_labels(int64_t batch, int64_t per_image, int64_t nc) {
  torch::Tensor index = torch::arange(batch).repeat_interleave(per_image).to(torch::kFloat).unsqueeze(1);
  torch::Tensor cls = torch::randint(0, nc, {batch * per_image, 1}).to(torch::kFloat);
  torch::Tensor centre = torch::rand({batch * per_image, 2}) * 0.6 + 0.2;
  torch::Tensor size = torch::rand({batch * per_image, 2}) * 0.2 + 0.05;
  return torch::cat({index, cls, centre, size}, 1);
}

}  // namespace

int main(int argc, char** argv) {
#ifdef YOLO8_BENCH_HEAP_TUNING
  yolo8::data::keep_large_buffers_in_heap();  // as in training, where the loader sets it
#endif
  std::map<std::string, std::string> args{{"imgsz", "320"},          {"batch", "16"}, {"steps", "5"},
                                          {"model", "yolov8n.yaml"}, {"labels", "8"}, {"threads", "0"}};
  std::string json_path = "benchmarks/results/train_step.json";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--json" && i + 1 < argc) {
      json_path = argv[++i];
    } else if (arg.find('=') != std::string::npos) {
      args[arg.substr(0, arg.find('='))] = arg.substr(arg.find('=') + 1);
    }
  }
  const int64_t imgsz = std::stoll(args["imgsz"]), batch = std::stoll(args["batch"]), steps = std::stoll(args["steps"]);
  const int64_t nc = 80;
  const int threads = std::stoi(args["threads"]);
  torch::set_num_threads(threads > 0 ? threads : static_cast<int>(std::thread::hardware_concurrency()));
  torch::manual_seed(0);
  const torch::Tensor images = torch::randint(0, 255, {batch, 3, imgsz, imgsz}).to(torch::kUInt8);
  const torch::Tensor labels = synthetic_labels(batch, std::stoll(args["labels"]), nc);
  nlohmann::json report;
  report["imgsz"] = imgsz;
  report["batch"] = batch;
  report["threads"] = torch::get_num_threads();
  std::printf("%s imgsz %lld batch %lld, %d threads, %lld timed steps\n", args["model"].c_str(),
              static_cast<long long>(imgsz), static_cast<long long>(batch), torch::get_num_threads(),
              static_cast<long long>(steps));
  std::printf("%-14s %10s %10s %10s %10s %10s %10s\n", "layout", "forward", "loss", "backward", "optim", "step ms",
              "images/s");
  for (const bool channels_last : {false, true}) {
    yolo8::DetectionModel model = yolo8::build_model(args["model"], nc);
    yolo8::DetectionModel ema = yolo8::DetectionModel(model->config());
    yolo8::TrainCoreConfig config;
    config.shape = yolo8::RunShape{1000, batch, 100, nc};
    config.batches_per_epoch = 100;
    config.channels_last = channels_last;
    config.optim.warmup_epochs = 0;
    yolo8::TrainingCore core(model, ema, config);
    std::map<std::string, double> total;
    for (int64_t step = -1; step < steps; ++step) {  // step -1 warms up
      auto start = Clock::now();
      const torch::Tensor input = core.prepare_images(images);
      const auto feats = core.model()->forward_maps(input);
      const double forward_ms = ms_since(start);
      start = Clock::now();
      const auto loss = core.loss()(feats, yolo8::LossTargets::from_label_rows(labels));
      const double loss_ms = ms_since(start);
      start = Clock::now();
      loss.total.backward();
      const double backward_ms = ms_since(start);
      start = Clock::now();
      torch::nn::utils::clip_grad_norm_(core.model()->parameters(), 10.0);
      core.optimizer().step();
      core.optimizer().zero_grad();
      core.ema().update(*core.model());
      const double optim_ms = ms_since(start);
      if (step < 0) continue;
      total["forward"] += forward_ms;
      total["loss"] += loss_ms;
      total["backward"] += backward_ms;
      total["optim"] += optim_ms;
    }
    for (auto& [key, value] : total) value /= static_cast<double>(steps);
    const double step_ms = total["forward"] + total["loss"] + total["backward"] + total["optim"];
    const char* layout = channels_last ? "channels_last" : "contiguous";
    std::printf("%-14s %10.1f %10.1f %10.1f %10.1f %10.1f %10.1f\n", layout, total["forward"], total["loss"],
                total["backward"], total["optim"], step_ms, 1000.0 * batch / step_ms);
    report[layout] = {
        {"forward_ms", total["forward"]}, {"loss_ms", total["loss"]}, {"backward_ms", total["backward"]},
        {"optim_ms", total["optim"]},     {"step_ms", step_ms},       {"images_per_s", 1000.0 * batch / step_ms}};
  }
  report["channels_last_speedup"] =
      report["contiguous"]["step_ms"].get<double>() / report["channels_last"]["step_ms"].get<double>();
  std::printf("channels_last speed-up: %.2fx\n", report["channels_last_speedup"].get<double>());
  std::ofstream(json_path) << report.dump(2) << "\n";
  return 0;
}
