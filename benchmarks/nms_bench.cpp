// NMS on 8400 anchors x 80 classes (yolov8 at 640) for validation and prediction settings.
#include <cstdio>
#include <iostream>

#include "benchmarks/loss_nms_bench_util.h"
#include "trainer/detect/nms.h"

int main(int argc, char** argv) {
  using namespace yolo8;
  try {
    auto args = bench::parse_args(argc, argv, "nms_bench");
    const int64_t batch = 16, nc = 80, anchors = 8400;
    torch::manual_seed(0);
    auto pred = torch::zeros({batch, 4 + nc, anchors});
    pred.narrow(1, 0, 2).copy_(torch::rand({batch, 2, anchors}) * 640);
    pred.narrow(1, 2, 2).copy_(torch::rand({batch, 2, anchors}) * 120 + 4);

    struct Setting {
      const char* name;
      double conf, iou;
      bool sparse;  // trained-model-like scores: ~3% object anchors, the rest near zero
    };
    const Setting settings[] = {
        {"val_uniform", 0.001, 0.7, false}, {"val_sparse", 0.001, 0.7, true}, {"predict_sparse", 0.25, 0.45, true}};
    nlohmann::json rows = nlohmann::json::array();
    std::printf("%-14s %6s %6s %11s %9s %11s %9s %11s\n", "setting", "conf", "iou", "candidates", "kept/img",
                "ms/batch16", "ms/img", "cpu_ms/img");
    for (const auto& s : settings) {
      auto p = pred.clone();
      auto scores = torch::rand({batch, nc, anchors});
      if (s.sparse) {
        auto objects = torch::rand({batch, 1, anchors}) < 0.03;
        scores = scores.pow(4) * torch::where(objects, torch::ones({}), torch::full({}, 0.01));
      }
      p.narrow(1, 4, nc).copy_(scores);
      NmsConfig cfg;
      cfg.conf_thres = s.conf;
      cfg.iou_thres = s.iou;
      const auto cand = (std::get<0>(p.narrow(1, 4, nc).max(1)) > s.conf).sum().item<double>() / batch;
      std::vector<torch::Tensor> out;
      const auto t = bench::measure([&] { out = non_max_suppression(p, cfg); }, args.iters, args.warmup);
      const double ms = t.wall_ms;
      double kept = 0;
      for (auto& o : out) kept += static_cast<double>(o.size(0));
      kept /= batch;
      std::printf("%-14s %6.3f %6.2f %11.0f %9.1f %11.2f %9.3f %11.3f\n", s.name, s.conf, s.iou, cand, kept, ms,
                  ms / batch, t.cpu_ms / batch);
      rows.push_back({{"setting", s.name},
                      {"conf", s.conf},
                      {"iou", s.iou},
                      {"candidates_per_image", cand},
                      {"kept_per_image", kept},
                      {"ms_per_batch", ms},
                      {"ms_per_image", ms / batch},
                      {"cpu_ms_per_image", t.cpu_ms / batch}});
    }
    bench::write_json(args.json_path, {{"benchmark", "nms_bench"},
                                       {"batch", batch},
                                       {"nc", nc},
                                       {"anchors", anchors},
                                       {"threads", torch::get_num_threads()},
                                       {"iters", args.iters},
                                       {"rows", rows}});
  } catch (const std::exception& e) {
    std::cerr << "nms_bench: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
