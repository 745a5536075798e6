#pragma once
// Optimizer construction following the Ultralytics recipe: three parameter groups, nominal batch size,
// the `auto` optimizer rule and per-group hyper-parameter access for the schedule.

#include <torch/torch.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "trainer/core/train_settings.h"  // OptimSettings, validate, canonical_optimizer_name

namespace yolo8 {

// Gradient accumulation and decay scaling that keep the nominal batch size.
struct BatchPlan {
  int64_t batch = 0;
  int64_t accumulate = 1;     // max(round(nbs / batch), 1)
  double weight_decay = 0.0;  // weight_decay * batch * accumulate / nbs
};
BatchPlan plan_batch(const OptimSettings& settings, int64_t batch);

// What the run trains with once `auto` is resolved.
struct OptimizerChoice {
  std::string name;  // SGD | Adam | AdamW
  double lr = 0.0;
  double momentum = 0.0;        // SGD momentum or Adam beta1
  double warmup_bias_lr = 0.0;  // zeroed by `auto`
};

// Facts about the run that `auto` needs.
struct RunShape {
  int64_t dataset_size = 0;  // training images
  int64_t batch = 16;        // global batch size
  int64_t epochs = 100;
  int64_t nc = 80;
};

// The reference rule: iterations = ceil(dataset_size / max(batch, nbs)) * epochs; above 10000 SGD (lr 0.01,
// momentum 0.9), otherwise AdamW with lr = round(0.002 * 5 / (4 + nc), 6) and beta1 0.9.
OptimizerChoice resolve_optimizer(const OptimSettings& settings, const RunShape& shape);

// Group indices; the order matches the reference optimizer.
inline constexpr int kBiasGroup = 0;
inline constexpr int kDecayGroup = 1;
inline constexpr int kNormGroup = 2;

struct ParamGroups {
  std::array<std::vector<torch::Tensor>, 3> params;
  std::array<std::vector<std::string>, 3> names;
};

// Any parameter named `bias` -> 0; weights of normalisation layers -> 2; every other parameter -> 1.
ParamGroups split_param_groups(const torch::nn::Module& model);

struct BuiltOptimizer {
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  OptimizerChoice choice;
  BatchPlan plan;
  ParamGroups groups;
};

// Builds the three-group optimizer for `model` (SGD with Nesterov, Adam or AdamW, no decay outside group 1).
BuiltOptimizer build_optimizer(torch::nn::Module& model, const OptimSettings& settings, const RunShape& shape);
// The same with an already resolved choice (a resumed run keeps the checkpoint's, even with another batch size).
BuiltOptimizer build_optimizer_with(torch::nn::Module& model, const OptimizerChoice& choice, const BatchPlan& plan);

// Hyper-parameters of one param group; "momentum" is SGD momentum or Adam/AdamW beta1.
double group_lr(const torch::optim::Optimizer& optimizer, size_t group);
void set_group_lr(torch::optim::Optimizer& optimizer, size_t group, double lr);
double group_momentum(const torch::optim::Optimizer& optimizer, size_t group);
void set_group_momentum(torch::optim::Optimizer& optimizer, size_t group, double momentum);
double group_weight_decay(const torch::optim::Optimizer& optimizer, size_t group);
void set_group_weight_decay(torch::optim::Optimizer& optimizer, size_t group, double weight_decay);
// True for SGD, whose momentum the warm-up ramps (Adam betas are left alone, as in the reference).
bool has_sgd_momentum(const torch::optim::Optimizer& optimizer);

}  // namespace yolo8
