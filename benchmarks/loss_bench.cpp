// Loss + assigner cost for yolov8n-shaped head maps at 640, batch 16, nc 80, with 10 and 200 labels per image.
#include <cstdio>
#include <iostream>

#include "benchmarks/loss_nms_bench_util.h"
#include "trainer/detect/box_ops.h"
#include "trainer/detect/loss.h"

namespace {

using namespace yolo8;

struct Setup {
  std::vector<torch::Tensor> feats;
  LossTargets targets;
};

Setup make_setup(int64_t batch, int64_t nc, int64_t labels_per_image, int64_t imgsz) {
  torch::manual_seed(0);
  Setup s;
  for (int64_t stride : {8, 16, 32}) {
    s.feats.push_back(torch::randn({batch, 64 + nc, imgsz / stride, imgsz / stride}));
  }
  const auto n = batch * labels_per_image;
  s.targets.batch_idx = torch::arange(batch, torch::kFloat32).repeat_interleave(labels_per_image);
  s.targets.cls = torch::randint(0, nc, {n}).to(torch::kFloat32);
  auto wh = torch::rand({n, 2}) * 0.3 + 0.01;
  auto xy = torch::rand({n, 2}) * (1 - wh) + wh / 2;
  s.targets.bboxes = torch::cat({xy, wh}, 1);
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    auto args = bench::parse_args(argc, argv, "loss_bench");
    const int64_t batch = 16, nc = 80, imgsz = 640;
    LossConfig cfg;
    cfg.nc = nc;
    DetectionLoss loss(cfg);
    TaskAlignedAssigner assigner(nc, cfg.assigner);

    nlohmann::json rows = nlohmann::json::array();
    std::printf("%-7s %13s %13s %16s %10s %10s %12s %10s\n", "labels", "assigner_ms", "loss_fwd_ms", "loss_fwd_bwd_ms",
                "asg_cpu", "fwd_cpu", "fwd_bwd_cpu", "asg/total");
    for (int64_t labels : {10, 200}) {
      auto s = make_setup(batch, nc, labels, imgsz);
      // Assigner alone on inputs shaped as the loss builds them.
      auto anchors = make_anchors({{80, 80}, {40, 40}, {20, 20}}, cfg.strides);
      const auto na = anchors.points.size(0);
      auto pd_scores = torch::rand({batch, na, nc});
      auto pd_boxes =
          xywh_to_xyxy(torch::cat({torch::rand({batch, na, 2}) * imgsz, torch::rand({batch, na, 2}) * 200}, -1));
      auto gt = DetectionLoss::pad_targets(s.targets, batch, torch::tensor({640.f, 640.f, 640.f, 640.f}));
      auto gt_labels = gt.narrow(2, 0, 1);
      auto gt_boxes = gt.narrow(2, 1, 4);
      auto mask_gt = gt_boxes.sum(2, true).gt(0).to(torch::kFloat32);
      auto anc_px = anchors.points * anchors.strides;
      const auto t_assign = bench::measure(
          [&] {
            assigner.assign(pd_scores, pd_boxes, anc_px, gt_labels, gt_boxes, mask_gt, {{80, 80}, {40, 40}, {20, 20}});
          },
          args.iters, args.warmup);

      std::vector<torch::Tensor> feats;
      for (auto& f : s.feats) feats.push_back(f.clone().requires_grad_(true));
      const auto t_fwd = bench::measure(
          [&] {
            torch::NoGradGuard ng;
            loss(feats, s.targets);
          },
          args.iters, args.warmup);
      const auto t_fwd_bwd = bench::measure(
          [&] {
            for (auto& f : feats) f.mutable_grad() = torch::Tensor();
            loss(feats, s.targets).total.backward();
          },
          args.iters, args.warmup);
      const double share = t_assign.cpu_ms / t_fwd_bwd.cpu_ms;
      std::printf("%-7lld %13.1f %13.1f %16.1f %10.1f %10.1f %12.1f %10.2f\n", static_cast<long long>(labels),
                  t_assign.wall_ms, t_fwd.wall_ms, t_fwd_bwd.wall_ms, t_assign.cpu_ms, t_fwd.cpu_ms, t_fwd_bwd.cpu_ms,
                  share);
      rows.push_back({{"labels_per_image", labels},
                      {"assigner_ms", t_assign.wall_ms},
                      {"loss_forward_ms", t_fwd.wall_ms},
                      {"loss_forward_backward_ms", t_fwd_bwd.wall_ms},
                      {"assigner_cpu_ms", t_assign.cpu_ms},
                      {"loss_forward_cpu_ms", t_fwd.cpu_ms},
                      {"loss_forward_backward_cpu_ms", t_fwd_bwd.cpu_ms},
                      {"assigner_share_of_loss_fwd_bwd_cpu", share}});
    }
    nlohmann::json out = {{"benchmark", "loss_bench"},
                          {"batch", batch},
                          {"nc", nc},
                          {"imgsz", imgsz},
                          {"anchors", 8400},
                          {"threads", torch::get_num_threads()},
                          {"iters", args.iters},
                          {"rows", rows}};
    bench::write_json(args.json_path, out);
  } catch (const std::exception& e) {
    std::cerr << "loss_bench: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
