#include "trainer/core/grad_scaler.h"

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

namespace yolo8 {

GradScaler::GradScaler(const GradScalerConfig& config) : config_(config) {
  if (!(config_.init_scale > 0) || !std::isfinite(config_.init_scale)) {
    throw std::invalid_argument("grad scaler: init_scale must be positive and finite, got " +
                                std::to_string(config_.init_scale));
  }
  if (!(config_.growth_factor > 1.0)) {
    throw std::invalid_argument("grad scaler: growth_factor must be > 1, got " + std::to_string(config_.growth_factor));
  }
  if (!(config_.backoff_factor > 0.0 && config_.backoff_factor < 1.0)) {
    throw std::invalid_argument("grad scaler: backoff_factor must be in (0, 1), got " +
                                std::to_string(config_.backoff_factor));
  }
  if (config_.growth_interval < 1) {
    throw std::invalid_argument("grad scaler: growth_interval must be >= 1, got " +
                                std::to_string(config_.growth_interval));
  }
  state_.scale = config_.init_scale;
}

torch::Tensor GradScaler::scale(const torch::Tensor& loss) const {
  if (!config_.enabled) return loss;
  return loss * state_.scale;
}

void GradScaler::unscale(const std::vector<torch::Tensor>& params) {
  if (!config_.enabled) return;
  if (unscaled_) throw std::logic_error("grad scaler: unscale() called twice before update()");
  torch::NoGradGuard no_grad;
  // Computed in double then rounded once, as the reference does; a power of two stays exact.
  const double inverse = static_cast<double>(static_cast<float>(1.0 / state_.scale));
  std::vector<torch::Tensor> grads;
  grads.reserve(params.size());
  for (const auto& param : params) {
    if (param.grad().defined()) grads.push_back(param.grad());
  }
  if (grads.empty()) {
    found_inf_ = torch::zeros({}, torch::kBool);
  } else {
    // Fused kernels on CUDA instead of a few launches per parameter. The max-norm is inf/NaN exactly when a
    // gradient holds inf/NaN, and cannot overflow the way a 2-norm of large finite values can.
    at::_foreach_mul_(grads, inverse);
    const std::vector<torch::Tensor> max_abs = at::_foreach_norm(grads, std::numeric_limits<double>::infinity());
    found_inf_ = torch::stack(max_abs).isfinite().all().logical_not();
  }
  found_inf_host_ = -1;
  unscaled_ = true;
}

bool GradScaler::found_non_finite() {
  if (!unscaled_) throw std::logic_error("grad scaler: unscale() must come before the step decision and update()");
  if (found_inf_host_ < 0) found_inf_host_ = found_inf_.item<bool>() ? 1 : 0;
  return found_inf_host_ == 1;
}

bool GradScaler::should_step() {
  if (!config_.enabled) return true;
  return !found_non_finite();
}

void GradScaler::update() {
  if (!config_.enabled) return;
  if (found_non_finite()) {
    state_.scale *= config_.backoff_factor;
    state_.growth_tracker = 0;
  } else if (state_.growth_tracker + 1 >= config_.growth_interval) {
    const double grown = state_.scale * config_.growth_factor;
    if (std::isfinite(grown)) state_.scale = grown;
    state_.growth_tracker = 0;
  } else {
    ++state_.growth_tracker;
  }
  found_inf_ = torch::Tensor();
  found_inf_host_ = -1;
  unscaled_ = false;
}

void GradScaler::restore(const GradScalerState& state) {
  if (!(state.scale > 0) || !std::isfinite(state.scale)) {
    throw std::invalid_argument("grad scaler state: scale must be positive and finite, got " +
                                std::to_string(state.scale));
  }
  if (state.growth_tracker < 0) {
    throw std::invalid_argument("grad scaler state: growth_tracker must be >= 0, got " +
                                std::to_string(state.growth_tracker));
  }
  state_ = state;
  found_inf_ = torch::Tensor();
  found_inf_host_ = -1;
  unscaled_ = false;
}

}  // namespace yolo8
