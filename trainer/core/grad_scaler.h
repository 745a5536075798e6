#pragma once
// Loss scaling for mixed-precision training (LibTorch has autocast but no GradScaler), with the semantics and
// defaults of torch.cuda.amp.GradScaler. Plain tensor ops, so it runs (and is tested) on CPU too.
//
// Per optimizer step: backward(scale(loss)) [repeated while accumulating] -> unscale(params) -> clip ->
// optimizer step only if should_step() -> update().

#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace yolo8 {

struct GradScalerConfig {
  bool enabled = true;          // false: every call is the identity and every step is taken
  double init_scale = 65536.0;  // 2^16
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;  // clean steps in a row before the scale grows
};

// What a checkpoint keeps so a resumed run scales exactly as the uninterrupted one.
struct GradScalerState {
  double scale = 65536.0;
  int64_t growth_tracker = 0;  // clean steps since the last growth or back-off
};

class GradScaler {
 public:
  // Throws std::invalid_argument naming the offending field.
  explicit GradScaler(const GradScalerConfig& config = {});

  bool enabled() const { return config_.enabled; }
  double current_scale() const { return state_.scale; }
  const GradScalerConfig& config() const { return config_; }

  // loss * scale (the same tensor when disabled).
  torch::Tensor scale(const torch::Tensor& loss) const;
  // Divides the gradients of `params` by the scale in place and records, on their device, whether any of them
  // holds inf/NaN. Once per optimizer step; a second call before update() throws.
  void unscale(const std::vector<torch::Tensor>& params);
  // False when unscale() found a non-finite gradient: skip the optimizer step. The only host sync of a step.
  bool should_step();
  // Backs the scale off after a non-finite step, grows it after `growth_interval` clean ones.
  void update();

  GradScalerState state() const { return state_; }
  // Throws std::invalid_argument for a non-positive scale or a negative tracker.
  void restore(const GradScalerState& state);

 private:
  bool found_non_finite();

  GradScalerConfig config_;
  GradScalerState state_;
  torch::Tensor found_inf_;  // bool scalar on the gradients' device; undefined until unscale()
  int found_inf_host_ = -1;  // -1: not read yet, else 0/1
  bool unscaled_ = false;
};

}  // namespace yolo8
