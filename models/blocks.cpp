#include "models/blocks.h"

#include <stdexcept>

#include "models/bn_silu.h"

namespace yolo8 {

int64_t auto_pad(int64_t k, int64_t d) {
  const int64_t effective = d > 1 ? d * (k - 1) + 1 : k;
  return effective / 2;
}

ConvImpl::ConvImpl(int64_t c1, int64_t c2, int64_t k, int64_t s, int64_t p, int64_t g, int64_t d, bool act)
    : act_(act) {
  if (c1 <= 0 || c2 <= 0 || k <= 0 || s <= 0 || g <= 0 || d <= 0 || c1 % g != 0 || c2 % g != 0) {
    throw std::invalid_argument("Conv: invalid arguments c1=" + std::to_string(c1) + " c2=" + std::to_string(c2) +
                                " k=" + std::to_string(k) + " s=" + std::to_string(s) + " g=" + std::to_string(g));
  }
  const int64_t pad = p < 0 ? auto_pad(k, d) : p;
  conv = register_module(
      "conv",
      torch::nn::Conv2d(torch::nn::Conv2dOptions(c1, c2, k).stride(s).padding(pad).dilation(d).groups(g).bias(false)));
  bn = register_module("bn",
                       torch::nn::BatchNorm2d(torch::nn::BatchNorm2dOptions(c2).eps(kBnEps).momentum(kBnMomentum)));
}

torch::Tensor ConvImpl::forward(const torch::Tensor& x) {
  torch::Tensor y = conv->forward(x);
  if (!fused_ && act_ && bn->is_training() && bn->options.momentum().has_value() && bn->options.affine() &&
      bn->options.track_running_stats() && batch_norm_silu_fusion() && batch_norm_silu_supported(y)) {
    bn->num_batches_tracked += 1;  // as BatchNorm2d's training forward
    return batch_norm_silu_train(y, bn->weight, bn->bias, bn->running_mean, bn->running_var, *bn->options.momentum(),
                                 bn->options.eps());
  }
  if (!fused_) y = bn->forward(y);
  return act_ ? torch::silu(y) : y;
}

void ConvImpl::fuse() {
  if (fused_) return;
  torch::NoGradGuard no_grad;
  const auto& o = conv->options;
  auto fused = torch::nn::Conv2d(torch::nn::Conv2dOptions(o.in_channels(), o.out_channels(), o.kernel_size())
                                     .stride(o.stride())
                                     .padding(o.padding())
                                     .dilation(o.dilation())
                                     .groups(o.groups())
                                     .bias(true));
  const torch::Tensor inv_std = torch::rsqrt(bn->running_var + bn->options.eps());
  const torch::Tensor scale = bn->weight * inv_std;
  fused->weight.copy_(conv->weight * scale.view({-1, 1, 1, 1}));
  fused->bias.copy_(bn->bias - bn->running_mean * scale);
  fused->to(conv->weight.device(), conv->weight.scalar_type());
  conv = replace_module("conv", fused);
  unregister_module("bn");
  bn = nullptr;
  fused_ = true;
}

BottleneckImpl::BottleneckImpl(int64_t c1, int64_t c2, bool shortcut, int64_t g, int64_t k1, int64_t k2, double e) {
  const auto c_ = static_cast<int64_t>(static_cast<double>(c2) * e);
  cv1 = register_module("cv1", Conv(c1, c_, k1, 1));
  cv2 = register_module("cv2", Conv(c_, c2, k2, 1, -1, g));
  add_ = shortcut && c1 == c2;
}

torch::Tensor BottleneckImpl::forward(const torch::Tensor& x) {
  torch::Tensor y = cv2->forward(cv1->forward(x));
  return add_ ? x + y : y;
}

C2fImpl::C2fImpl(int64_t c1, int64_t c2, int64_t n, bool shortcut, int64_t g, double e) {
  c_ = static_cast<int64_t>(static_cast<double>(c2) * e);
  cv1 = register_module("cv1", Conv(c1, 2 * c_, 1, 1));
  cv2 = register_module("cv2", Conv((2 + n) * c_, c2, 1));
  m = register_module("m", torch::nn::ModuleList());
  for (int64_t i = 0; i < n; ++i) {
    blocks_.emplace_back(c_, c_, shortcut, g, 3, 3, 1.0);
    m->push_back(blocks_.back());
  }
}

torch::Tensor C2fImpl::forward(const torch::Tensor& x) {
  std::vector<torch::Tensor> ys = cv1->forward(x).chunk(2, 1);
  ys.reserve(2 + blocks_.size());
  for (auto& b : blocks_) ys.push_back(b->forward(ys.back()));
  return cv2->forward(torch::cat(ys, 1));
}

SPPFImpl::SPPFImpl(int64_t c1, int64_t c2, int64_t k) {
  const int64_t c_ = c1 / 2;
  cv1 = register_module("cv1", Conv(c1, c_, 1, 1));
  cv2 = register_module("cv2", Conv(c_ * 4, c2, 1, 1));
  m = register_module("m", torch::nn::MaxPool2d(torch::nn::MaxPool2dOptions(k).stride(1).padding(k / 2)));
}

torch::Tensor SPPFImpl::forward(const torch::Tensor& x) {
  std::vector<torch::Tensor> ys{cv1->forward(x)};
  for (int i = 0; i < 3; ++i) ys.push_back(m->forward(ys.back()));
  return cv2->forward(torch::cat(ys, 1));
}

torch::Tensor ConcatImpl::forward(const std::vector<torch::Tensor>& xs) { return torch::cat(xs, dim_); }

UpsampleImpl::UpsampleImpl(double scale, std::string mode) : scale_(scale), mode_(std::move(mode)) {
  if (mode_ != "nearest")
    throw std::invalid_argument("Upsample: only mode 'nearest' is supported, got '" + mode_ + "'");
  if (!(scale_ > 0)) throw std::invalid_argument("Upsample: scale factor must be positive");
}

torch::Tensor UpsampleImpl::forward(const torch::Tensor& x) {
  return torch::nn::functional::interpolate(x, torch::nn::functional::InterpolateFuncOptions()
                                                   .scale_factor(std::vector<double>{scale_, scale_})
                                                   .mode(torch::kNearest));
}

DFLImpl::DFLImpl(int64_t c1) : c1_(c1) {
  conv = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(c1, 1, 1).bias(false)));
  torch::NoGradGuard no_grad;
  conv->weight.copy_(torch::arange(c1, torch::kFloat).view({1, c1, 1, 1}));
  conv->weight.set_requires_grad(false);
}

torch::Tensor DFLImpl::forward(const torch::Tensor& x) {
  const int64_t b = x.size(0), a = x.size(2);
  torch::Tensor p = x.view({b, 4, c1_, a}).transpose(2, 1).softmax(1);
  return conv->forward(p).view({b, 4, a});
}

}  // namespace yolo8
