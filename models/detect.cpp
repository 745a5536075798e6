#include "models/detect.h"

#include <ATen/autocast_mode.h>
#include <torch/version.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace yolo8 {

namespace {

// CPU autocast's state through the per-device calls of LibTorch 2.4+; before those, CPU autocast is never on
// (trainer/core/autocast.cpp).
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
bool cpu_autocast_enabled() { return at::autocast::is_autocast_enabled(at::kCPU); }
// Turns CPU autocast off for a scope and back on after it (it was on: cpu_autocast_enabled()).
struct CpuAutocastOff {
  CpuAutocastOff() { at::autocast::set_autocast_enabled(at::kCPU, false); }
  ~CpuAutocastOff() { at::autocast::set_autocast_enabled(at::kCPU, true); }
  CpuAutocastOff(const CpuAutocastOff&) = delete;
  CpuAutocastOff& operator=(const CpuAutocastOff&) = delete;
};
#else
bool cpu_autocast_enabled() { return false; }
struct CpuAutocastOff {};
#endif

}  // namespace

std::pair<torch::Tensor, torch::Tensor> make_anchors(const std::vector<torch::Tensor>& feats,
                                                     const torch::Tensor& strides, double offset) {
  std::vector<torch::Tensor> points, stride_list;
  auto s_cpu = strides.to(torch::kCPU, torch::kDouble);
  for (size_t i = 0; i < feats.size(); ++i) {
    const auto& f = feats[i];
    const int64_t h = f.size(2), w = f.size(3);
    auto opts = torch::TensorOptions().dtype(f.scalar_type()).device(f.device());
    auto sx = torch::arange(w, opts) + offset;
    auto sy = torch::arange(h, opts) + offset;
    auto grid = torch::meshgrid({sy, sx}, "ij");
    points.push_back(torch::stack({grid[1], grid[0]}, -1).view({-1, 2}));
    stride_list.push_back(torch::full({h * w, 1}, s_cpu[static_cast<int64_t>(i)].item<double>(), opts));
  }
  return {torch::cat(points), torch::cat(stride_list)};
}

torch::Tensor dist2bbox(const torch::Tensor& distance, const torch::Tensor& anchors, bool xywh, int64_t dim) {
  auto lt_rb = distance.chunk(2, dim);
  auto x1y1 = anchors - lt_rb[0];
  auto x2y2 = anchors + lt_rb[1];
  if (xywh) return torch::cat({(x1y1 + x2y2) / 2, x2y2 - x1y1}, dim);
  return torch::cat({x1y1, x2y2}, dim);
}

DetectImpl::DetectImpl(int64_t nc, std::vector<int64_t> ch) : nc_(nc), ch_(std::move(ch)) {
  if (nc_ <= 0) throw std::invalid_argument("Detect: nc must be positive, got " + std::to_string(nc_));
  if (ch_.empty()) throw std::invalid_argument("Detect: needs at least one input level");
  const int64_t c2 = std::max({int64_t{16}, ch_[0] / 4, kRegMax * 4});
  const int64_t c3 = std::max(ch_[0], std::min(nc_, int64_t{100}));
  cv2 = register_module("cv2", torch::nn::ModuleList());
  cv3 = register_module("cv3", torch::nn::ModuleList());
  for (int64_t c : ch_) {
    torch::nn::Sequential box(Conv(c, c2, 3), Conv(c2, c2, 3),
                              torch::nn::Conv2d(torch::nn::Conv2dOptions(c2, 4 * kRegMax, 1)));
    torch::nn::Sequential cls(Conv(c, c3, 3), Conv(c3, c3, 3), torch::nn::Conv2d(torch::nn::Conv2dOptions(c3, nc_, 1)));
    cv2->push_back(box);
    cv3->push_back(cls);
    box_.push_back(box);
    cls_.push_back(cls);
  }
  dfl = register_module("dfl", DFL(kRegMax));
  stride = torch::zeros({nl()});
}

std::vector<torch::Tensor> DetectImpl::forward_maps(const std::vector<torch::Tensor>& feats) {
  if (static_cast<int64_t>(feats.size()) != nl()) {
    throw std::invalid_argument("Detect: expected " + std::to_string(nl()) + " inputs, got " +
                                std::to_string(feats.size()));
  }
  const bool float_outputs = !is_training() && cpu_autocast_enabled();
  std::vector<torch::Tensor> out;
  out.reserve(feats.size());
  for (size_t i = 0; i < feats.size(); ++i) {
    out.push_back(torch::cat({branch(box_[i], feats[i], float_outputs), branch(cls_[i], feats[i], float_outputs)}, 1));
  }
  return out;
}

torch::Tensor DetectImpl::branch(torch::nn::Sequential& seq, const torch::Tensor& x, bool float_output) {
  if (!float_output) return seq->forward(x);
  torch::Tensor h = seq->ptr<ConvImpl>(0)->forward(x);
  h = seq->ptr<ConvImpl>(1)->forward(h);
  const CpuAutocastOff float32;
  return seq->ptr<torch::nn::Conv2dImpl>(2)->forward(h.to(torch::kFloat));
}

torch::Tensor DetectImpl::decode(const std::vector<torch::Tensor>& maps) {
  const int64_t b = maps.at(0).size(0);
  std::vector<torch::Tensor> flat;
  for (const auto& m : maps) flat.push_back(m.view({b, no(), -1}));
  auto x_cat = torch::cat(flat, 2);
  auto [points, strides] = make_anchors(maps, stride, 0.5);
  auto parts = x_cat.split_with_sizes({kRegMax * 4, nc_}, 1);
  auto dbox = dist2bbox(dfl->forward(parts[0]), points.transpose(0, 1).unsqueeze(0), true, 1) * strides.transpose(0, 1);
  return torch::cat({dbox, parts[1].sigmoid()}, 1);
}

void DetectImpl::bias_init() {
  torch::NoGradGuard no_grad;
  auto s = stride.to(torch::kCPU, torch::kDouble);
  for (int64_t i = 0; i < nl(); ++i) {
    const double si = s[i].item<double>();
    if (!(si > 0)) throw std::logic_error("Detect::bias_init: strides are not computed yet");
    box_[i]->ptr<torch::nn::Conv2dImpl>(2)->bias.fill_(1.0);
    cls_[i]->ptr<torch::nn::Conv2dImpl>(2)->bias.fill_(
        std::log(5.0 / static_cast<double>(nc_) / std::pow(640.0 / si, 2)));
  }
}

}  // namespace yolo8
