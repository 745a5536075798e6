#include "trainer/core/optimizer.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>

namespace yolo8 {
namespace {

// Python's round(x, 6): printf rounds the exact binary value, as CPython does.
double round6(double x) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.6f", x);
  return std::strtod(buf, nullptr);
}

bool is_norm_layer(const torch::nn::Module& m) {
  return dynamic_cast<const torch::nn::BatchNorm1dImpl*>(&m) || dynamic_cast<const torch::nn::BatchNorm2dImpl*>(&m) ||
         dynamic_cast<const torch::nn::BatchNorm3dImpl*>(&m) ||
         dynamic_cast<const torch::nn::InstanceNorm1dImpl*>(&m) ||
         dynamic_cast<const torch::nn::InstanceNorm2dImpl*>(&m) ||
         dynamic_cast<const torch::nn::InstanceNorm3dImpl*>(&m) || dynamic_cast<const torch::nn::LayerNormImpl*>(&m) ||
         dynamic_cast<const torch::nn::GroupNormImpl*>(&m);
}

void check_group(const torch::optim::Optimizer& optimizer, size_t group) {
  if (group >= optimizer.param_groups().size()) {
    throw std::out_of_range("optimizer has " + std::to_string(optimizer.param_groups().size()) +
                            " param groups, asked for group " + std::to_string(group));
  }
}

template <typename Options>
const Options* options_as(const torch::optim::Optimizer& optimizer, size_t group) {
  check_group(optimizer, group);
  return dynamic_cast<const Options*>(&optimizer.param_groups()[group].options());
}

template <typename Options>
Options* options_as(torch::optim::Optimizer& optimizer, size_t group) {
  check_group(optimizer, group);
  return dynamic_cast<Options*>(&optimizer.param_groups()[group].options());
}

[[noreturn]] void unsupported() {
  throw std::invalid_argument("optimizer: only SGD, Adam and AdamW param groups are supported");
}

}  // namespace

BatchPlan plan_batch(const OptimSettings& settings, int64_t batch) {
  if (batch < 1) throw std::invalid_argument("batch: must be >= 1, got " + std::to_string(batch));
  BatchPlan plan;
  plan.batch = batch;
  // nearbyint rounds half to even, like Python's round().
  plan.accumulate = std::max<int64_t>(
      static_cast<int64_t>(std::nearbyint(static_cast<double>(settings.nbs) / static_cast<double>(batch))), 1);
  plan.weight_decay = settings.weight_decay * static_cast<double>(batch) * static_cast<double>(plan.accumulate) /
                      static_cast<double>(settings.nbs);
  return plan;
}

OptimizerChoice resolve_optimizer(const OptimSettings& settings, const RunShape& shape) {
  OptimizerChoice c;
  c.name = canonical_optimizer_name(settings.optimizer);
  c.lr = settings.lr0;
  c.momentum = settings.momentum;
  c.warmup_bias_lr = settings.warmup_bias_lr;
  if (c.name != "auto") return c;
  const double per_epoch =
      std::ceil(static_cast<double>(shape.dataset_size) / static_cast<double>(std::max(shape.batch, settings.nbs)));
  const double iterations = per_epoch * static_cast<double>(shape.epochs);
  if (iterations > 10000) {
    c.name = "SGD";
    c.lr = 0.01;
  } else {
    c.name = "AdamW";
    c.lr = round6(0.002 * 5 / (4 + static_cast<double>(shape.nc)));
  }
  c.momentum = 0.9;
  c.warmup_bias_lr = 0.0;
  return c;
}

ParamGroups split_param_groups(const torch::nn::Module& model) {
  ParamGroups g;
  for (const auto& item : model.named_modules()) {
    const bool norm = is_norm_layer(*item.value());
    for (const auto& p : item.value()->named_parameters(/*recurse=*/false)) {
      const int group = p.key() == "bias" ? kBiasGroup : (norm ? kNormGroup : kDecayGroup);
      g.params[group].push_back(p.value());
      g.names[group].push_back(item.key().empty() ? p.key() : item.key() + "." + p.key());
    }
  }
  return g;
}

BuiltOptimizer build_optimizer(torch::nn::Module& model, const OptimSettings& settings, const RunShape& shape) {
  validate(settings);
  return build_optimizer_with(model, resolve_optimizer(settings, shape), plan_batch(settings, shape.batch));
}

BuiltOptimizer build_optimizer_with(torch::nn::Module& model, const OptimizerChoice& choice, const BatchPlan& plan) {
  if (!(choice.lr >= 0.0)) throw std::invalid_argument("optimizer: lr must be >= 0");
  if (choice.name == "SGD" && !(choice.momentum > 0.0)) {
    throw std::invalid_argument("momentum: SGD with Nesterov needs momentum > 0");
  }
  BuiltOptimizer out;
  out.plan = plan;
  out.choice = choice;
  out.groups = split_param_groups(model);
  const auto& c = out.choice;
  const std::array<double, 3> decay = {0.0, out.plan.weight_decay, 0.0};

  std::vector<torch::optim::OptimizerParamGroup> groups;
  if (c.name == "SGD") {
    for (int i = 0; i < 3; ++i) {
      auto o = std::make_unique<torch::optim::SGDOptions>(c.lr);
      o->momentum(c.momentum).nesterov(true).weight_decay(decay[i]);
      groups.emplace_back(out.groups.params[i], std::move(o));
    }
    torch::optim::SGDOptions defaults(c.lr);
    defaults.momentum(c.momentum).nesterov(true);
    out.optimizer = std::make_unique<torch::optim::SGD>(std::move(groups), defaults);
  } else if (c.name == "Adam") {
    for (int i = 0; i < 3; ++i) {
      auto o = std::make_unique<torch::optim::AdamOptions>(c.lr);
      o->betas({c.momentum, 0.999}).weight_decay(decay[i]);
      groups.emplace_back(out.groups.params[i], std::move(o));
    }
    out.optimizer = std::make_unique<torch::optim::Adam>(std::move(groups), torch::optim::AdamOptions(c.lr));
  } else if (c.name == "AdamW") {
    for (int i = 0; i < 3; ++i) {
      auto o = std::make_unique<torch::optim::AdamWOptions>(c.lr);
      o->betas({c.momentum, 0.999}).weight_decay(decay[i]);
      groups.emplace_back(out.groups.params[i], std::move(o));
    }
    out.optimizer = std::make_unique<torch::optim::AdamW>(std::move(groups), torch::optim::AdamWOptions(c.lr));
  } else {
    throw std::invalid_argument("optimizer: cannot build '" + c.name + "'");
  }
  return out;
}

double group_lr(const torch::optim::Optimizer& optimizer, size_t group) {
  check_group(optimizer, group);
  return optimizer.param_groups()[group].options().get_lr();
}

void set_group_lr(torch::optim::Optimizer& optimizer, size_t group, double lr) {
  check_group(optimizer, group);
  optimizer.param_groups()[group].options().set_lr(lr);
}

double group_momentum(const torch::optim::Optimizer& optimizer, size_t group) {
  if (auto* o = options_as<torch::optim::SGDOptions>(optimizer, group)) return o->momentum();
  if (auto* adam = options_as<torch::optim::AdamOptions>(optimizer, group)) return std::get<0>(adam->betas());
  if (auto* adamw = options_as<torch::optim::AdamWOptions>(optimizer, group)) return std::get<0>(adamw->betas());
  unsupported();
}

void set_group_momentum(torch::optim::Optimizer& optimizer, size_t group, double momentum) {
  if (auto* sgd = options_as<torch::optim::SGDOptions>(optimizer, group)) {
    sgd->momentum(momentum);
  } else if (auto* adam = options_as<torch::optim::AdamOptions>(optimizer, group)) {
    adam->betas({momentum, std::get<1>(adam->betas())});
  } else if (auto* adamw = options_as<torch::optim::AdamWOptions>(optimizer, group)) {
    adamw->betas({momentum, std::get<1>(adamw->betas())});
  } else {
    unsupported();
  }
}

double group_weight_decay(const torch::optim::Optimizer& optimizer, size_t group) {
  if (auto* o = options_as<torch::optim::SGDOptions>(optimizer, group)) return o->weight_decay();
  if (auto* o = options_as<torch::optim::AdamOptions>(optimizer, group)) return o->weight_decay();
  if (auto* o = options_as<torch::optim::AdamWOptions>(optimizer, group)) return o->weight_decay();
  unsupported();
}

void set_group_weight_decay(torch::optim::Optimizer& optimizer, size_t group, double weight_decay) {
  if (auto* sgd = options_as<torch::optim::SGDOptions>(optimizer, group)) {
    sgd->weight_decay(weight_decay);
  } else if (auto* adam = options_as<torch::optim::AdamOptions>(optimizer, group)) {
    adam->weight_decay(weight_decay);
  } else if (auto* adamw = options_as<torch::optim::AdamWOptions>(optimizer, group)) {
    adamw->weight_decay(weight_decay);
  } else {
    unsupported();
  }
}

bool has_sgd_momentum(const torch::optim::Optimizer& optimizer) {
  return !optimizer.param_groups().empty() && options_as<torch::optim::SGDOptions>(optimizer, 0) != nullptr;
}

}  // namespace yolo8
