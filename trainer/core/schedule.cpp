#include "trainer/core/schedule.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace yolo8 {
namespace {

int64_t warmup_length(double warmup_epochs, int64_t nb) {
  if (!(warmup_epochs > 0.0)) return -1;
  // nearbyint rounds half to even like Python's round().
  return std::max<int64_t>(static_cast<int64_t>(std::nearbyint(warmup_epochs * static_cast<double>(nb))), 100);
}

}  // namespace

double interp2(double x, double x0, double x1, double y0, double y1) {
  if (x <= x0) return y0;
  if (x >= x1) return y1;
  const double slope = (y1 - y0) / (x1 - x0);
  return slope * (x - x0) + y0;
}

TrainSchedule::TrainSchedule(const OptimSettings& settings, const OptimizerChoice& choice, int64_t batch,
                             int64_t epochs, int64_t batches_per_epoch, int64_t start_epoch)
    : settings_(settings), choice_(choice), batch_(batch), epochs_(epochs), batches_per_epoch_(batches_per_epoch) {
  validate(settings_);
  if (batch < 1) throw std::invalid_argument("batch: must be >= 1, got " + std::to_string(batch));
  if (epochs < 1) throw std::invalid_argument("epochs: must be >= 1, got " + std::to_string(epochs));
  if (batches_per_epoch < 1) {
    throw std::invalid_argument("batches per epoch must be >= 1, got " + std::to_string(batches_per_epoch));
  }
  warmup_iters_ = warmup_length(settings_.warmup_epochs, batches_per_epoch_);
  initial_lr_.fill(choice_.lr);
  state_.accumulate = plan_batch(settings_, batch_).accumulate;
  state_.scheduler_epoch = start_epoch - 1;
}

double TrainSchedule::lr_factor(double x) const {
  const double n = static_cast<double>(epochs_);
  if (settings_.cos_lr) {
    const double pi = 3.14159265358979323846;
    return std::max((1.0 - std::cos(x * pi / n)) / 2.0, 0.0) * (settings_.lrf - 1.0) + 1.0;
  }
  return std::max(1.0 - x / n, 0.0) * (1.0 - settings_.lrf) + settings_.lrf;
}

void TrainSchedule::begin_iteration(torch::optim::Optimizer& optimizer, int64_t epoch, int64_t ni) {
  if (ni > warmup_iters_) return;
  const double x = static_cast<double>(ni);
  const double x1 = static_cast<double>(warmup_iters_);
  const double acc =
      std::nearbyint(interp2(x, 0.0, x1, 1.0, static_cast<double>(settings_.nbs) / static_cast<double>(batch_)));
  state_.accumulate = std::max<int64_t>(1, static_cast<int64_t>(acc));
  const bool sgd = has_sgd_momentum(optimizer);
  const double factor = lr_factor(static_cast<double>(epoch));
  const size_t n = std::min<size_t>(optimizer.param_groups().size(), initial_lr_.size());
  for (size_t j = 0; j < n; ++j) {
    // Bias lr falls from warmup_bias_lr, the others rise from 0, both to the scheduled lr.
    const double start = j == static_cast<size_t>(kBiasGroup) ? choice_.warmup_bias_lr : 0.0;
    set_group_lr(optimizer, j, interp2(x, 0.0, x1, start, initial_lr_[j] * factor));
    // The reference ramps towards the momentum setting even when `auto` built SGD with 0.9.
    if (sgd) {
      set_group_momentum(optimizer, j, interp2(x, 0.0, x1, settings_.warmup_momentum, settings_.momentum));
    }
  }
}

void TrainSchedule::record_step(int64_t ni) {
  state_.last_opt_step = ni;
  ++state_.optimizer_steps;
}

void TrainSchedule::end_epoch(torch::optim::Optimizer& optimizer) {
  ++state_.scheduler_epoch;
  const double factor = lr_factor(static_cast<double>(state_.scheduler_epoch));
  const size_t n = std::min<size_t>(optimizer.param_groups().size(), initial_lr_.size());
  for (size_t j = 0; j < n; ++j) set_group_lr(optimizer, j, initial_lr_[j] * factor);
}

BatchPlan TrainSchedule::change_batch(torch::optim::Optimizer& optimizer, int64_t batch, int64_t batches_per_epoch,
                                      int64_t resume_ni) {
  if (batches_per_epoch < 1) {
    throw std::invalid_argument("batches per epoch must be >= 1, got " + std::to_string(batches_per_epoch));
  }
  const BatchPlan plan = plan_batch(settings_, batch);
  batch_ = batch;
  batches_per_epoch_ = batches_per_epoch;
  warmup_iters_ = warmup_length(settings_.warmup_epochs, batches_per_epoch_);
  state_.accumulate = plan.accumulate;
  state_.last_opt_step = resume_ni - 1;
  if (optimizer.param_groups().size() > static_cast<size_t>(kDecayGroup)) {
    set_group_weight_decay(optimizer, kDecayGroup, plan.weight_decay);
  }
  return plan;
}

namespace {

// The 2-norm clipping of torch::nn::utils::clip_grad_norm_ (same maths, so the same bits), without its host
// read of the norm: the scaler's found-inf read stays the only sync of a step.
void clip_grad_norm_on_device(const std::vector<torch::Tensor>& params, double max_norm) {
  std::vector<torch::Tensor> norms;
  for (const auto& p : params) {
    if (p.grad().defined()) norms.push_back(p.grad().norm(2));
  }
  if (norms.empty()) return;
  const torch::Tensor total = norms.size() == 1 ? norms[0] : torch::stack(norms).norm(2);
  const torch::Tensor coef = torch::clamp(max_norm / (total + 1e-6), torch::nullopt, 1.0);
  torch::NoGradGuard no_grad;
  for (const auto& p : params) {
    if (p.grad().defined()) p.grad().mul_(coef);
  }
}

}  // namespace

bool recipe_optimizer_step(torch::optim::Optimizer& optimizer, torch::nn::Module& model, ModelEma* ema, double max_norm,
                           GradScaler* scaler) {
  const std::vector<torch::Tensor> params = model.parameters();
  // The reference's order: unscale, clip the true gradients, step unless inf/NaN, update the scale.
  if (scaler != nullptr) scaler->unscale(params);
  clip_grad_norm_on_device(params, max_norm);
  const bool taken = scaler == nullptr || scaler->should_step();
  if (taken) optimizer.step();
  if (scaler != nullptr) scaler->update();
  optimizer.zero_grad();
  if (taken && ema != nullptr) ema->update(model);
  return taken;
}

void TrainSchedule::restore(const ScheduleState& state) {
  if (state.accumulate < 1) throw std::invalid_argument("schedule state: accumulate must be >= 1");
  if (state.optimizer_steps < 0) throw std::invalid_argument("schedule state: optimizer_steps must be >= 0");
  state_ = state;
}

}  // namespace yolo8
