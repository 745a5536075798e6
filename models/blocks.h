#pragma once
// YOLOv8 building blocks. Submodule names match Ultralytics' state-dict keys.
#include <torch/torch.h>

#include <string>
#include <vector>

namespace yolo8 {

inline constexpr double kBnEps = 1e-3;
inline constexpr double kBnMomentum = 0.03;

// Padding that keeps the spatial size for stride 1 ("same").
int64_t auto_pad(int64_t k, int64_t d = 1);

// Conv2d (no bias) + BatchNorm2d + SiLU; fuse() folds the BN into a biased conv.
class ConvImpl : public torch::nn::Module {
 public:
  ConvImpl(int64_t c1, int64_t c2, int64_t k = 1, int64_t s = 1, int64_t p = -1, int64_t g = 1, int64_t d = 1,
           bool act = true);
  // x: B×c1×H×W -> B×c2×H/s×W/s
  torch::Tensor forward(const torch::Tensor& x);
  void fuse();
  bool fused() const { return fused_; }
  bool has_act() const { return act_; }
  torch::nn::Conv2d conv{nullptr};
  torch::nn::BatchNorm2d bn{nullptr};

 private:
  bool act_ = true;
  bool fused_ = false;
};
TORCH_MODULE(Conv);

class BottleneckImpl : public torch::nn::Module {
 public:
  BottleneckImpl(int64_t c1, int64_t c2, bool shortcut = true, int64_t g = 1, int64_t k1 = 3, int64_t k2 = 3,
                 double e = 0.5);
  // x: B×c1×H×W -> B×c2×H×W
  torch::Tensor forward(const torch::Tensor& x);
  // True when the input is added to the output (shortcut and equal channel counts).
  bool adds_input() const { return add_; }
  Conv cv1{nullptr}, cv2{nullptr};

 private:
  bool add_ = false;
};
TORCH_MODULE(Bottleneck);

// CSP bottleneck with two convolutions; every bottleneck output is concatenated.
class C2fImpl : public torch::nn::Module {
 public:
  C2fImpl(int64_t c1, int64_t c2, int64_t n = 1, bool shortcut = false, int64_t g = 1, double e = 0.5);
  // x: B×c1×H×W -> B×c2×H×W
  torch::Tensor forward(const torch::Tensor& x);
  Conv cv1{nullptr}, cv2{nullptr};
  torch::nn::ModuleList m{nullptr};

 private:
  int64_t c_ = 0;
  std::vector<Bottleneck> blocks_;
};
TORCH_MODULE(C2f);

// Spatial pyramid pooling, fast: three chained max-pools of size k.
class SPPFImpl : public torch::nn::Module {
 public:
  SPPFImpl(int64_t c1, int64_t c2, int64_t k = 5);
  // x: B×c1×H×W -> B×c2×H×W
  torch::Tensor forward(const torch::Tensor& x);
  Conv cv1{nullptr}, cv2{nullptr};
  torch::nn::MaxPool2d m{nullptr};
};
TORCH_MODULE(SPPF);

// Parameter-free layers still occupy a `model.N` slot, hence modules.
class ConcatImpl : public torch::nn::Module {
 public:
  explicit ConcatImpl(int64_t dim = 1) : dim_(dim) {}
  // xs: list of B×Ci×H×W -> B×ΣCi×H×W
  torch::Tensor forward(const std::vector<torch::Tensor>& xs);

 private:
  int64_t dim_;
};
TORCH_MODULE(Concat);

class UpsampleImpl : public torch::nn::Module {
 public:
  explicit UpsampleImpl(double scale = 2.0, std::string mode = "nearest");
  // x: B×C×H×W -> B×C×(H·s)×(W·s)
  torch::Tensor forward(const torch::Tensor& x);
  double scale() const { return scale_; }

 private:
  double scale_;
  std::string mode_;
};
TORCH_MODULE(Upsample);

// Distribution focal loss integral: expected bin index under a softmax over reg_max bins.
class DFLImpl : public torch::nn::Module {
 public:
  explicit DFLImpl(int64_t c1 = 16);
  // x: B×(4·c1)×A -> B×4×A
  torch::Tensor forward(const torch::Tensor& x);
  torch::nn::Conv2d conv{nullptr};

 private:
  int64_t c1_;
};
TORCH_MODULE(DFL);

}  // namespace yolo8
