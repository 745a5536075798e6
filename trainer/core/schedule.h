#pragma once
// Per-iteration optimizer bookkeeping of the Ultralytics recipe: LR lambda (linear or one-cycle cosine),
// warm-up of lr / momentum / accumulation, and when the optimizer steps.

#include <torch/torch.h>

#include <array>
#include <cstdint>

#include "trainer/core/ema.h"
#include "trainer/core/grad_scaler.h"
#include "trainer/core/optimizer.h"

namespace yolo8 {

// Everything a checkpoint needs to continue the schedule exactly.
struct ScheduleState {
  int64_t scheduler_epoch = -1;  // the LR scheduler's last_epoch
  int64_t accumulate = 1;
  int64_t last_opt_step = -1;   // global iteration of the last optimizer step
  int64_t optimizer_steps = 0;  // optimizer steps taken so far
};

// Usage per epoch e, batch i (ni = i + nb * e):
//   begin_iteration(opt, e, ni); forward/backward; if (should_step(ni)) { opt.step(); record_step(ni); }
// and end_epoch(opt) after the last batch of each epoch.
class TrainSchedule {
 public:
  TrainSchedule(const OptimSettings& settings, const OptimizerChoice& choice, int64_t batch, int64_t epochs,
                int64_t batches_per_epoch, int64_t start_epoch = 0);

  // LR multiplier for an epoch: linear (1 - x/epochs)(1 - lrf) + lrf, or cosine from 1 to lrf.
  double lr_factor(double epoch) const;
  // Warm-up length in iterations: max(round(warmup_epochs * nb), 100), or -1 when warmup_epochs is 0.
  int64_t warmup_iterations() const { return warmup_iters_; }

  // Applies the warm-up (accumulate, group lr, SGD momentum) to `optimizer` while ni <= warm-up length.
  void begin_iteration(torch::optim::Optimizer& optimizer, int64_t epoch, int64_t ni);
  bool should_step(int64_t ni) const { return ni - state_.last_opt_step >= state_.accumulate; }
  void record_step(int64_t ni);
  // The once-per-epoch scheduler step: lr of every group = initial_lr * lr_factor(epoch count).
  void end_epoch(torch::optim::Optimizer& optimizer);

  // Resume with another batch size: nbs and the counters are kept; accumulate, the group-1 weight decay and the
  // warm-up length follow the new batch. `resume_ni` is the next global iteration under the new batches/epoch;
  // accumulation restarts there (gradients from before are not carried over).
  BatchPlan change_batch(torch::optim::Optimizer& optimizer, int64_t batch, int64_t batches_per_epoch,
                         int64_t resume_ni);

  int64_t accumulate() const { return state_.accumulate; }
  int64_t optimizer_steps() const { return state_.optimizer_steps; }
  int64_t last_opt_step() const { return state_.last_opt_step; }
  int64_t batch() const { return batch_; }
  int64_t batches_per_epoch() const { return batches_per_epoch_; }
  const std::array<double, 3>& initial_lr() const { return initial_lr_; }
  const OptimizerChoice& choice() const { return choice_; }

  const ScheduleState& state() const { return state_; }
  void restore(const ScheduleState& state);

 private:
  OptimSettings settings_;
  OptimizerChoice choice_;
  int64_t batch_;
  int64_t epochs_;
  int64_t batches_per_epoch_;
  int64_t warmup_iters_;
  std::array<double, 3> initial_lr_;
  ScheduleState state_;
};

// The reference's optimizer step, one path with or without mixed precision: unscale the gradients (`scaler`
// given and enabled), clip their total 2-norm to `max_norm` on the device (torch::nn::utils::clip_grad_norm_'s
// maths, so the same bits, without its host read of the norm), step unless the scaler found inf/NaN, update the
// scale, zero the gradients and update the EMA (when given) after a step. Returns whether the optimizer stepped.
// The caller then calls schedule.record_step(ni).
bool recipe_optimizer_step(torch::optim::Optimizer& optimizer, torch::nn::Module& model, ModelEma* ema,
                           double max_norm = 10.0, GradScaler* scaler = nullptr);

// numpy.interp with two support points, same arithmetic (exact end points).
double interp2(double x, double x0, double x1, double y0, double y1);

}  // namespace yolo8
