#pragma once
// Exponential moving average of a model's floating parameters and buffers, as in the Ultralytics recipe.

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace yolo8 {

class ModelEma {
 public:
  // `ema_model` is a separate instance of the same architecture (for instance `model->clone()`, or a second
  // model built from the same config); it takes a deep copy of `model`'s values and is put in eval mode.
  ModelEma(std::shared_ptr<torch::nn::Module> ema_model, const torch::nn::Module& model, double decay = 0.9999,
           double tau = 2000.0, int64_t updates = 0);

  // For modules deriving from torch::nn::Cloneable: the copy is made with clone().
  static ModelEma clone_of(const std::shared_ptr<torch::nn::Module>& model, double decay = 0.9999, double tau = 2000.0);

  // decay * (1 - exp(-updates / tau))
  double decay_at(int64_t updates) const;
  // One EMA step after an optimizer step: increments `updates`, then ema = d * ema + (1 - d) * model over every
  // floating parameter and buffer (integer buffers such as num_batches_tracked are left as copied).
  void update(const torch::nn::Module& model);

  int64_t updates() const { return updates_; }
  void set_updates(int64_t updates);
  torch::nn::Module& module() { return *ema_; }
  const torch::nn::Module& module() const { return *ema_; }
  const std::shared_ptr<torch::nn::Module>& module_ptr() const { return ema_; }

 private:
  std::shared_ptr<torch::nn::Module> ema_;
  double decay_;
  double tau_;
  int64_t updates_;
  std::vector<std::string> names_;      // state-dict names of the averaged tensors
  std::vector<torch::Tensor> tensors_;  // the EMA's averaged tensors, same order
};

// Parameters then buffers under state-dict names (what checkpoints store).
std::vector<std::pair<std::string, torch::Tensor>> state_tensors(const torch::nn::Module& module);

}  // namespace yolo8
