#pragma once
// A small synthetic training setup for the memory tests: no YOLOv8 needed.

#include <torch/torch.h>

#include "trainer/core/auto_batch.h"
#include "trainer/core/memory_meter.h"

namespace yolo8::test {

// A few strided convs and a classifier: memory grows with batch and pixel count like a detector's.
struct ConvStackNetImpl : torch::nn::Module {
  ConvStackNetImpl()
      : c1(register_module("c1", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 16, 3).padding(1)))),
        c2(register_module("c2", torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 32, 3).stride(2).padding(1)))),
        c3(register_module("c3", torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 64, 3).stride(2).padding(1)))),
        head(register_module("head", torch::nn::Linear(64, 10))) {}
  // x: [B, 3, H, W] -> logits [B, 10]
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor y = torch::silu(c1->forward(x));
    y = torch::silu(c2->forward(y));
    y = torch::silu(c3->forward(y));
    return head->forward(y.mean({2, 3}));
  }
  torch::nn::Conv2d c1, c2, c3;
  torch::nn::Linear head;
};
TORCH_MODULE(ConvStackNet);

// One training step (forward, loss, backward, SGD with momentum) measured by the meter.
struct TinyTrainer {
  explicit TinyTrainer(int image_size)
      : imgsz(image_size), optimizer(net->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9)) {
    torch::manual_seed(0);
  }
  void step(int batch) {
    optimizer.zero_grad();
    const torch::Tensor x = torch::randn({batch, 3, imgsz, imgsz});
    const torch::Tensor target = torch::randint(0, 10, {batch}, torch::kLong);
    torch::nn::functional::cross_entropy(net->forward(x), target).backward();
    optimizer.step();
  }
  int64_t train_step(int batch) {
    return measure_peak_bytes(meter, [&] { step(batch); });
  }
  int64_t validation_step(int batch) {
    return measure_peak_bytes(meter, [&] {
      torch::NoGradGuard no_grad;
      const torch::Tensor x = torch::randn({batch, 3, imgsz, imgsz});
      net->forward(x).argmax(1);
    });
  }
  int imgsz;
  MemoryMeter meter;
  ConvStackNet net;
  torch::optim::SGD optimizer;
};

}  // namespace yolo8::test
