#include "trainer/detect/validator.h"

#include "trainer/detect/box_ops.h"

namespace yolo8 {

torch::Tensor boxes_to_original(const torch::Tensor& boxes, const ImageGeometry& geometry) {
  torch::Tensor mapped = boxes.clone();
  auto xs = mapped.slice(1, 0, 1), ys = mapped.slice(1, 1, 2), xe = mapped.slice(1, 2, 3), ye = mapped.slice(1, 3, 4);
  xs.sub_(geometry.pad_w).div_(geometry.gain_w).clamp_(0, static_cast<double>(geometry.orig_w));
  xe.sub_(geometry.pad_w).div_(geometry.gain_w).clamp_(0, static_cast<double>(geometry.orig_w));
  ys.sub_(geometry.pad_h).div_(geometry.gain_h).clamp_(0, static_cast<double>(geometry.orig_h));
  ye.sub_(geometry.pad_h).div_(geometry.gain_h).clamp_(0, static_cast<double>(geometry.orig_h));
  return mapped;
}

DetectionValidator::DetectionValidator(int64_t nc, std::vector<std::string> names, ValConfig config)
    : nc_(nc), names_(std::move(names)), config_(config), metrics_(nc), confusion_(nc, config.conf) {}

std::vector<torch::Tensor> DetectionValidator::add_batch(const torch::Tensor& preds, const torch::Tensor& labels,
                                                         int64_t height, int64_t width,
                                                         const std::vector<ImageGeometry>& geometry,
                                                         const std::vector<std::string>& paths) {
  NmsConfig nms;
  nms.conf_thres = config_.conf;
  nms.iou_thres = config_.iou;
  nms.max_det = config_.max_det;
  nms.multi_label = true;  // the reference validator keeps every class above the threshold
  nms.agnostic = config_.single_cls;
  const std::vector<torch::Tensor> detections = non_max_suppression(preds.to(torch::kCPU).to(torch::kFloat), nms);
  const torch::Tensor rows = labels.to(torch::kCPU).to(torch::kFloat).reshape({-1, 6});
  const torch::Tensor scale = torch::tensor(
      {static_cast<float>(width), static_cast<float>(height), static_cast<float>(width), static_cast<float>(height)});
  std::vector<torch::Tensor> mapped_detections;
  for (size_t image = 0; image < detections.size(); ++image) {
    const torch::Tensor mine = rows.index({rows.select(1, 0) == static_cast<double>(image)});
    // The reference maps labels and detections back with one gain, the height's (scale_boxes takes
    // ratio_pad[0][0]): up to 0.4 % off in x where the two sides round differently, but its metrics are the yardstick.
    ImageGeometry reference_geometry = geometry[image];
    reference_geometry.gain_w = reference_geometry.gain_h;
    torch::Tensor label_boxes = xywh_to_xyxy(mine.slice(1, 2, 6)) * scale;
    label_boxes = boxes_to_original(label_boxes, reference_geometry);
    const torch::Tensor image_labels = torch::cat({mine.slice(1, 1, 2), label_boxes}, 1);
    torch::Tensor detected = detections[image];
    if (config_.single_cls && detected.size(0) > 0) detected.select(1, 5).zero_();
    detected = boxes_to_original(detected, reference_geometry);
    metrics_.update(detected, image_labels);
    confusion_.update(detected, image_labels);
    if (config_.save_json && image < paths.size()) json_.add(coco_image_id(paths[image]), detected);
    mapped_detections.push_back(detected);
  }
  return mapped_detections;
}

void DetectionValidator::add_loss(const DetectionLoss& loss, const std::vector<torch::Tensor>& feats,
                                  const torch::Tensor& labels) {
  torch::NoGradGuard no_grad;
  const LossOutput output = loss(feats, LossTargets::from_label_rows(labels.to(feats[0].device())));
  const torch::Tensor items = output.items.to(torch::kCPU).to(torch::kDouble);
  loss_sum_ = loss_sum_.defined() ? loss_sum_ + items : items;
  ++loss_batches_;
}

std::vector<double> DetectionValidator::mean_loss() const {
  if (loss_batches_ == 0) return {0.0, 0.0, 0.0};
  const torch::Tensor mean = loss_sum_ / static_cast<double>(loss_batches_);
  return {mean[0].item<double>(), mean[1].item<double>(), mean[2].item<double>()};
}

void DetectionValidator::write_json(const std::string& path) const { json_.write(path); }

}  // namespace yolo8
