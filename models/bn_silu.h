#pragma once
// BatchNorm (training mode, batch statistics) fused with SiLU, forward and backward in one pass each, for the
// Conv block on CPU: float32, and the bfloat16 of autocast (channels-last, on CPUs with AVX512-BF16, computed in
// float). Same maths as BatchNorm2d + SiLU; the BN output is recomputed in backward instead
// of being kept, so the step holds one activation less per Conv and touches memory fewer times.
#include <torch/torch.h>

namespace yolo8 {

// Whether ConvImpl uses the fused path in training mode (off gives the unfused ATen ops). By default on where the
// AVX-512 loops run and off elsewhere, where they were measured slower than ATen's (bn_silu.cpp); the setting
// overrides that for the whole process.
void set_batch_norm_silu_fusion(bool enabled);
bool batch_norm_silu_fusion();

// True when batch_norm_silu_train accepts x: a 4-D CPU float32 tensor, or bfloat16 in channels-last memory with a
// multiple of 16 channels where the CPU has AVX512-BF16 (elsewhere ATen's bfloat16 ops run).
bool batch_norm_silu_supported(const torch::Tensor& x);

// silu(batch_norm(x)) on x's batch statistics (biased variance, eps), updating running_mean / running_var in
// place with the unbiased variance and `momentum` as BatchNorm2d does (num_batches_tracked is the caller's).
// x: B×C×H×W, contiguous or channels-last (the output keeps x's layout); weight, bias, running stats: (C).
// Differentiable in x, weight and bias; deterministic for any thread count.
torch::Tensor batch_norm_silu_train(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                                    torch::Tensor& running_mean, torch::Tensor& running_var, double momentum,
                                    double eps);

}  // namespace yolo8
