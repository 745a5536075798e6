// Bare training step of yolov8n on synthetic tensors, phase by phase: forward, loss, backward, optimizer, EMA.
// Usage: train_step_bench [imgsz=320] [batch=16] [steps=5] [labels=8 (per image)] [nc=80] [model=yolov8n.yaml]
//        [threads=0 (all cores)] [layout=both|contiguous|channels_last]
//        [fusion=on|off|both (BN+SiLU fused in training)] [amp=off|on (bfloat16 autocast forward, as training on
//        a CPU with native bfloat16)] [--json PATH]
// Each phase is timed in process CPU time (all threads; the figure to compare on a shared machine) and wall time.
// Compares contiguous vs channels-last layouts in one run (ratios, not absolute times, are the point).
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "models/bn_silu.h"
#include "models/yolo.h"
#include "trainer/core/autocast.h"
#include "trainer/core/train_step.h"
#ifdef YOLO8_BENCH_HEAP_TUNING
#include "data/loader.h"
#endif

namespace {
using Clock = std::chrono::steady_clock;

double cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) * 1e-6;
}

// One phase's wall and CPU time since construction.
struct PhaseTimer {
  Clock::time_point wall = Clock::now();
  double cpu = cpu_ms();
  std::pair<double, double> lap() {
    const auto now = Clock::now();
    const double c = cpu_ms();
    std::pair<double, double> out{std::chrono::duration<double, std::milli>(now - wall).count(), c - cpu};
    wall = now;
    cpu = c;
    return out;
  }
};

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
  std::map<std::string, std::string> args{
      {"imgsz", "320"}, {"batch", "16"},  {"steps", "5"},     {"model", "yolov8n.yaml"}, {"labels", "8"},
      {"nc", "80"},     {"threads", "0"}, {"layout", "both"}, {"fusion", "on"},          {"amp", "off"}};
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
  const int64_t nc = std::stoll(args["nc"]);
  const int threads = std::stoi(args["threads"]);
  const bool amp = args["amp"] == "on";
  torch::set_num_threads(threads > 0 ? threads : static_cast<int>(std::thread::hardware_concurrency()));
  torch::manual_seed(0);
  const torch::Tensor images = torch::randint(0, 255, {batch, 3, imgsz, imgsz}).to(torch::kUInt8);
  const torch::Tensor labels = synthetic_labels(batch, std::stoll(args["labels"]), nc);
  std::vector<bool> layouts;
  if (args["layout"] != "channels_last") layouts.push_back(false);
  if (args["layout"] != "contiguous") layouts.push_back(true);
  nlohmann::json report;
  report["imgsz"] = imgsz;
  report["batch"] = batch;
  report["labels_per_image"] = std::stoll(args["labels"]);
  report["nc"] = nc;
  report["threads"] = torch::get_num_threads();
  report["amp_bfloat16"] = amp;
  std::printf("%s imgsz %lld batch %lld, %lld labels per image, nc %lld, %d threads, %lld timed steps%s\n",
              args["model"].c_str(), static_cast<long long>(imgsz), static_cast<long long>(batch),
              std::stoll(args["labels"]), static_cast<long long>(nc), torch::get_num_threads(),
              static_cast<long long>(steps), amp ? ", bfloat16 autocast forward" : "");
  std::printf("CPU ms per step (wall ms in brackets)\n");
  std::printf("%-22s %17s %17s %17s %17s %17s %17s\n", "variant", "forward", "loss", "backward", "optim", "ema",
              "step");
  const std::vector<std::string> kPhases = {"forward", "loss", "backward", "optim", "ema"};
  // Every variant (layout x BN+SiLU fusion) has its own model; their steps interleave, so load changes on a
  // shared machine hit all of them alike.
  struct Variant {
    std::string name;
    bool channels_last = false, fusion = true;
    std::unique_ptr<yolo8::TrainingCore> core;
    std::map<std::string, double> wall, cpu;
  };
  std::vector<Variant> variants;
  std::vector<bool> fusions;
  if (args["fusion"] != "off") fusions.push_back(true);
  if (args["fusion"] != "on") fusions.push_back(false);
  for (const bool channels_last : layouts) {
    for (const bool fusion : fusions) {
      Variant v;
      v.name = std::string(channels_last ? "channels_last" : "contiguous") + (fusion ? "" : "/unfused");
      v.channels_last = channels_last;
      v.fusion = fusion;
      torch::manual_seed(0);
      yolo8::DetectionModel model = yolo8::build_model(args["model"], nc);
      yolo8::DetectionModel ema = yolo8::DetectionModel(model->config());
      yolo8::TrainCoreConfig config;
      config.shape = yolo8::RunShape{1000, batch, 100, nc};
      config.batches_per_epoch = 100;
      config.channels_last = channels_last;
      config.optim.warmup_epochs = 0;
      v.core = std::make_unique<yolo8::TrainingCore>(model, ema, config);
      variants.push_back(std::move(v));
    }
  }
  for (int64_t step = -1; step < steps; ++step) {  // step -1 warms up
    for (auto& v : variants) {
      yolo8::set_batch_norm_silu_fusion(v.fusion);
      auto& core = *v.core;
      const bool timed = step >= 0;
      auto add = [&](const std::string& phase, std::pair<double, double> lap) {
        if (!timed) return;
        v.wall[phase] += lap.first;
        v.cpu[phase] += lap.second;
      };
      PhaseTimer timer;
      const torch::Tensor input = core.prepare_images(images);
      std::vector<torch::Tensor> feats;
      {
        yolo8::AutocastGuard autocast(torch::kCPU, amp);
        feats = core.model()->forward_maps(input);
      }
      if (amp) {
        for (auto& feat : feats) feat = feat.to(torch::kFloat);
      }
      add("forward", timer.lap());
      const auto loss = core.loss()(feats, yolo8::LossTargets::from_label_rows(labels));
      add("loss", timer.lap());
      loss.total.backward();
      add("backward", timer.lap());
      torch::nn::utils::clip_grad_norm_(core.model()->parameters(), 10.0);
      core.optimizer().step();
      core.optimizer().zero_grad();
      add("optim", timer.lap());
      core.ema().update(*core.model());
      add("ema", timer.lap());
    }
  }
  yolo8::set_batch_norm_silu_fusion(true);
  for (auto& v : variants) {
    nlohmann::json row;
    double step_wall = 0, step_cpu = 0;
    std::printf("%-22s", v.name.c_str());
    for (const auto& phase : kPhases) {
      const double w = v.wall[phase] / static_cast<double>(steps), c = v.cpu[phase] / static_cast<double>(steps);
      step_wall += w;
      step_cpu += c;
      std::printf(" %8.1f [%6.1f]", c, w);
      row[phase + "_ms"] = w;
      row[phase + "_cpu_ms"] = c;
    }
    std::printf(" %8.1f [%6.1f]  %.1f images/s\n", step_cpu, step_wall, 1000.0 * batch / step_wall);
    row["step_ms"] = step_wall;
    row["step_cpu_ms"] = step_cpu;
    row["images_per_s"] = 1000.0 * batch / step_wall;
    report[v.name] = row;
  }
  if (report.contains("channels_last") && report.contains("channels_last/unfused")) {
    report["fusion_cpu_speedup"] = report["channels_last/unfused"]["step_cpu_ms"].get<double>() /
                                   report["channels_last"]["step_cpu_ms"].get<double>();
    std::printf("BN+SiLU fusion CPU-time speed-up (channels_last): %.3fx\n",
                report["fusion_cpu_speedup"].get<double>());
  }
  if (report.contains("contiguous") && report.contains("channels_last")) {
    report["channels_last_speedup"] =
        report["contiguous"]["step_ms"].get<double>() / report["channels_last"]["step_ms"].get<double>();
    std::printf("channels_last speed-up: %.2fx\n", report["channels_last_speedup"].get<double>());
  }
  std::ofstream(json_path) << report.dump(2) << "\n";
  return 0;
}
