#pragma once
// A small network with every kind of parameter the recipe separates: conv weight, norm weight/bias, linear bias.

#include <torch/torch.h>

namespace yolo8::test {

struct TinyNetImpl : torch::nn::Cloneable<TinyNetImpl> {
  TinyNetImpl() { reset(); }
  void reset() override {
    conv = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 4, 3).bias(false)));
    bn = register_module("bn", torch::nn::BatchNorm2d(torch::nn::BatchNormOptions(4).eps(1e-3).momentum(0.03)));
    fc = register_module("fc", torch::nn::Linear(4, 2));
  }
  // x: (N, 3, H, W) -> (N, 2)
  torch::Tensor forward(const torch::Tensor& x) {
    auto y = torch::silu(bn->forward(conv->forward(x)));
    return fc->forward(y.mean({2, 3}));
  }
  torch::nn::Conv2d conv{nullptr};
  torch::nn::BatchNorm2d bn{nullptr};
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(TinyNet);

// One forward/backward on fixed random data so optimizers have gradients to use.
inline void tiny_backward(TinyNet& net, int64_t seed) {
  auto gen = at::detail::createCPUGenerator(static_cast<uint64_t>(seed));
  auto x = at::randn({2, 3, 6, 6}, gen);
  net->forward(x).square().sum().backward();
}

}  // namespace yolo8::test
