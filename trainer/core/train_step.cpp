#include "trainer/core/train_step.h"

#include <sstream>

#include "trainer/core/autocast.h"

namespace yolo8 {

void to_channels_last(torch::nn::Module& module) {
  torch::NoGradGuard no_grad;
  for (auto& parameter : module.parameters()) {
    if (parameter.dim() == 4) parameter.set_data(parameter.contiguous(torch::MemoryFormat::ChannelsLast));
  }
}

std::vector<int64_t> freeze_layer_indices(const std::string& freeze) {
  std::string cleaned;
  for (char c : freeze) cleaned += (c == '[' || c == ']' || c == ',') ? ' ' : c;
  std::istringstream stream(cleaned);
  std::vector<int64_t> values;
  int64_t value = 0;
  while (stream >> value) values.push_back(value);
  const bool is_count = values.size() == 1 && freeze.find_first_of("[,") == std::string::npos;
  if (!is_count) return values;
  std::vector<int64_t> first_n;
  for (int64_t i = 0; i < values[0]; ++i) first_n.push_back(i);
  return first_n;
}

bool loss_scaling_applies(const TrainCoreConfig& config) {
  // bfloat16 has float32's exponent range: gradients neither overflow nor underflow for want of a scale.
  return config.amp && config.device.is_cuda() && config.cuda_amp_dtype == c10::ScalarType::Half;
}

namespace {

GradScalerConfig scaler_config(const TrainCoreConfig& config) {
  GradScalerConfig scaler = config.grad_scaler;
  switch (config.loss_scaling) {
    case LossScaling::kAuto: scaler.enabled = loss_scaling_applies(config); break;
    case LossScaling::kOn: scaler.enabled = true; break;
    case LossScaling::kOff: scaler.enabled = false; break;
  }
  return scaler;
}

}  // namespace

TrainingCore::TrainingCore(DetectionModel model, DetectionModel ema_model, const TrainCoreConfig& config)
    : config_(config),
      model_(std::move(model)),
      ema_model_(std::move(ema_model)),
      scaler_(scaler_config(config)),
      autocast_(autocast_applies(config.amp, config.device.type())) {
  model_->to(config_.device);
  ema_model_->to(config_.device);
  if (config_.channels_last) {
    to_channels_last(*model_);
    to_channels_last(*ema_model_);
  }
  // The DFL projection is a constant of the head, never trained; frozen layers follow the setting.
  for (auto& item : model_->named_parameters()) {
    bool frozen = item.key().find(".dfl") != std::string::npos;
    for (int64_t layer : config_.freeze_layers) {
      frozen = frozen || item.key().rfind("model." + std::to_string(layer) + ".", 0) == 0;
    }
    item.value().set_requires_grad(!frozen);
    if (!frozen) trainable_.push_back(item.value());
  }
  model_->train();
  ema_ = std::make_unique<ModelEma>(ema_model_.ptr(), *model_);

  built_ = config_.optimizer_choice ? build_optimizer_with(*model_, *config_.optimizer_choice,
                                                           plan_batch(config_.optim, config_.shape.batch))
                                    : build_optimizer(*model_, config_.optim, config_.shape);
  schedule_ = std::make_unique<TrainSchedule>(config_.optim, built_.choice, config_.shape.batch, config_.shape.epochs,
                                              config_.batches_per_epoch, config_.start_epoch);
  LossConfig loss_config;
  loss_config.nc = model_->nc();
  const auto strides = model_->strides();
  loss_config.strides.assign(strides.data_ptr<float>(), strides.data_ptr<float>() + strides.numel());
  loss_config.box = config_.gains.box;
  loss_config.cls = config_.gains.cls;
  loss_config.dfl = config_.gains.dfl;
  loss_ = std::make_unique<DetectionLoss>(loss_config);
}

torch::Tensor TrainingCore::prepare_images(const torch::Tensor& images) const {
  torch::Tensor batch = images.to(config_.device, /*non_blocking=*/true);
  batch = batch.scalar_type() == torch::kUInt8 ? batch.to(torch::kFloat).div_(255.0) : batch.to(torch::kFloat);
  return config_.channels_last ? batch.contiguous(torch::MemoryFormat::ChannelsLast) : batch.contiguous();
}

StepOutcome TrainingCore::step(int64_t epoch, int64_t ni, const torch::Tensor& images, const torch::Tensor& labels,
                               int64_t chunks) {
  schedule_->begin_iteration(*built_.optimizer, epoch, ni);
  const int64_t batch = images.size(0);
  chunks = std::max<int64_t>(1, std::min(chunks, batch));
  const int64_t chunk_size = (batch + chunks - 1) / chunks;
  const torch::Tensor rows = labels.to(config_.device).to(torch::kFloat).reshape({-1, 6});
  StepOutcome outcome;
  const bool completes_window = schedule_->should_step(ni);
  for (int64_t first = 0; first < batch; first += chunk_size) {
    const int64_t last = std::min(batch, first + chunk_size);
    torch::Tensor chunk_rows = rows;
    if (chunks > 1) {
      const torch::Tensor image_index = rows.select(1, 0);
      chunk_rows = rows.index({(image_index >= first) & (image_index < last)}).clone();
      chunk_rows.select(1, 0).sub_(static_cast<double>(first));
    }
    const torch::Tensor chunk_images = prepare_images(chunks > 1 ? images.slice(0, first, last) : images);
    std::vector<torch::Tensor> feats;
    {
      AutocastGuard autocast(config_.device.type(), autocast_, config_.cuda_amp_dtype);
      feats = model_->forward_maps(chunk_images);
    }
    // The loss (assigner, IoU, DFL) runs in float32 on float16 / bfloat16 head outputs.
    if (autocast_) {
      for (auto& feat : feats) feat = feat.to(torch::kFloat);
    }
    const LossOutput loss = (*loss_)(feats, LossTargets::from_label_rows(chunk_rows));
    if (completes_window && last == batch && config_.gradient_sync) {
      config_.gradient_sync->before_final_backward(trainable_);
    }
    scaler_.scale(loss.total).backward();
    const double weight = static_cast<double>(last - first) / static_cast<double>(batch);
    outcome.loss_items = outcome.loss_items.defined() ? outcome.loss_items + loss.items * weight
                                                      : (chunks > 1 ? loss.items * weight : loss.items);
  }
  if (completes_window) {
    const bool taken = optimizer_step();
    schedule_->record_step(ni);
    outcome.optimizer_stepped = taken;
    outcome.skipped_non_finite = !taken;
  }
  return outcome;
}

bool TrainingCore::optimizer_step() {
  if (config_.gradient_sync) config_.gradient_sync->combine(trainable_);
  return recipe_optimizer_step(*built_.optimizer, *model_, ema_.get(), config_.clip_norm, &scaler_);
}

StepOutcome TrainingCore::guarded_step(int64_t epoch, int64_t ni, const torch::Tensor& images,
                                       const torch::Tensor& labels, OomGuard& guard) {
  std::vector<torch::Tensor> saved_grads;
  for (auto& parameter : model_->parameters()) {
    saved_grads.push_back(parameter.grad().defined() ? parameter.grad().clone() : torch::Tensor());
  }
  const auto restore_grads = [&] {
    if (config_.gradient_sync) config_.gradient_sync->abandon_final_backward();
    size_t k = 0;
    for (auto& parameter : model_->parameters()) {
      const torch::Tensor& saved = saved_grads[k++];
      parameter.mutable_grad() = saved.defined() ? saved.clone() : torch::Tensor();
    }
  };
  StepOutcome outcome;
  guard.run(
      images.size(0), [&](int64_t passes) { outcome = step(epoch, ni, images, labels, passes); }, restore_grads);
  return outcome;
}

void TrainingCore::end_epoch() { schedule_->end_epoch(*built_.optimizer); }

std::vector<double> TrainingCore::learning_rates() const {
  std::vector<double> rates;
  for (size_t group = 0; group < built_.optimizer->param_groups().size(); ++group) {
    rates.push_back(group_lr(*built_.optimizer, group));
  }
  return rates;
}

}  // namespace yolo8
