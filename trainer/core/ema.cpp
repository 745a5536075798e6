#include "trainer/core/ema.h"

#include <cmath>
#include <stdexcept>
#include <unordered_map>

namespace yolo8 {

std::vector<std::pair<std::string, torch::Tensor>> state_tensors(const torch::nn::Module& module) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& p : module.named_parameters(/*recurse=*/true)) out.emplace_back(p.key(), p.value());
  for (const auto& b : module.named_buffers(/*recurse=*/true)) out.emplace_back(b.key(), b.value());
  return out;
}

ModelEma::ModelEma(std::shared_ptr<torch::nn::Module> ema_model, const torch::nn::Module& model, double decay,
                   double tau, int64_t updates)
    : ema_(std::move(ema_model)), decay_(decay), tau_(tau), updates_(updates) {
  if (!ema_) throw std::invalid_argument("ModelEma: the EMA model is null");
  if (!(decay >= 0.0 && decay < 1.0)) throw std::invalid_argument("ModelEma: decay must be in [0, 1)");
  if (!(tau > 0.0)) throw std::invalid_argument("ModelEma: tau must be > 0");
  set_updates(updates);
  const auto src = state_tensors(model);
  const auto dst = state_tensors(*ema_);
  if (src.size() != dst.size()) {
    throw std::invalid_argument("ModelEma: the EMA model has " + std::to_string(dst.size()) + " tensors, the model " +
                                std::to_string(src.size()));
  }
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < src.size(); ++i) {
    const auto& [name, s] = src[i];
    auto d = dst[i].second;
    if (dst[i].first != name || !d.sizes().equals(s.sizes())) {
      throw std::invalid_argument("ModelEma: tensor " + std::to_string(i) + " is '" + dst[i].first +
                                  "' in the EMA model but '" + name + "' in the model, or their shapes differ");
    }
    // A clone may share storage with the source; the EMA needs its own.
    if (d.data_ptr() == s.data_ptr())
      throw std::invalid_argument("ModelEma: EMA tensor '" + name + "' aliases the model");
    d.copy_(s);
    if (d.is_floating_point()) {
      names_.push_back(name);
      tensors_.push_back(d);
    }
  }
  for (auto& p : ema_->parameters()) p.set_requires_grad(false);
  ema_->eval();
}

ModelEma ModelEma::clone_of(const std::shared_ptr<torch::nn::Module>& model, double decay, double tau) {
  if (!model) throw std::invalid_argument("ModelEma: the model is null");
  return ModelEma(model->clone(), *model, decay, tau);
}

double ModelEma::decay_at(int64_t updates) const {
  return decay_ * (1.0 - std::exp(-static_cast<double>(updates) / tau_));
}

void ModelEma::set_updates(int64_t updates) {
  if (updates < 0) throw std::invalid_argument("ModelEma: updates must be >= 0");
  updates_ = updates;
}

void ModelEma::update(const torch::nn::Module& model) {
  const auto src = state_tensors(model);
  std::vector<torch::Tensor> current;
  current.reserve(tensors_.size());
  size_t k = 0;
  for (const auto& [name, t] : src) {
    if (k < names_.size() && names_[k] == name) {
      current.push_back(t.detach());
      ++k;
    }
  }
  if (k != names_.size()) {
    throw std::invalid_argument("ModelEma::update: the model lacks tensor '" + names_[k] + "'");
  }
  ++updates_;
  const double d = decay_at(updates_);
  torch::NoGradGuard no_grad;
  torch::_foreach_mul_(tensors_, d);
  torch::_foreach_add_(tensors_, current, 1.0 - d);
}

}  // namespace yolo8
