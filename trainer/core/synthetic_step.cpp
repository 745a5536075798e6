#include "trainer/core/synthetic_step.h"

#include <algorithm>

#include "trainer/core/train_step.h"

namespace yolo8 {

SyntheticBatch synthetic_batch(int64_t batch, int64_t imgsz, int64_t nc, int64_t labels_per_image, uint64_t seed) {
  torch::Generator generator = at::detail::createCPUGenerator(seed);
  SyntheticBatch out;
  out.images = torch::randint(0, 256, {batch, 3, imgsz, imgsz}, generator, torch::kUInt8);
  const int64_t count = batch * labels_per_image;
  const torch::Tensor index = torch::arange(batch, torch::kFloat).repeat_interleave(labels_per_image).unsqueeze(1);
  const torch::Tensor cls = torch::randint(0, nc, {count, 1}, generator, torch::kFloat);
  // Sizes from 2 % to 50 % of the image so every level of the head gets targets.
  const torch::Tensor size = torch::rand({count, 2}, generator) * 0.48 + 0.02;
  const torch::Tensor centre = size / 2 + torch::rand({count, 2}, generator) * (1 - size);
  out.labels = torch::cat({index, cls, centre, size}, 1);
  return out;
}

namespace {

// Distinct images made on the CPU; a batch repeats them on the device. Drawing every image on one core took longer
// than the step itself on a GPU (a 640 px batch of 890 images is 1.1 G values), and what the images hold does not
// change a step's memory or time.
constexpr int64_t kDistinctImages = 8;

SyntheticBatch device_batch(int64_t batch, int64_t imgsz, int64_t nc, int64_t labels_per_image, uint64_t seed,
                            const torch::Device& device) {
  const SyntheticBatch distinct = synthetic_batch(std::min(batch, kDistinctImages), imgsz, nc, labels_per_image, seed);
  const int64_t n = distinct.images.size(0);
  SyntheticBatch out;
  const torch::Tensor source = distinct.images.to(device);
  out.images = source.index_select(0, torch::arange(batch, torch::dtype(torch::kLong).device(device)).remainder(n));
  // Labels of image i are those of image i mod n, with the batch index rewritten.
  const torch::Tensor per_image = distinct.labels.view({n, labels_per_image, 6});
  torch::Tensor labels = per_image.index_select(0, torch::arange(batch).remainder(n)).reshape({-1, 6}).clone();
  labels.select(1, 0).copy_(torch::arange(batch, torch::kFloat).repeat_interleave(labels_per_image));
  out.labels = labels.to(device);
  return out;
}

}  // namespace

struct SyntheticStepRunner::State {
  std::unique_ptr<TrainingCore> core;
  torch::Device device = torch::kCPU;
  int64_t imgsz = 640;
  int64_t labels_per_image = 8;
  int64_t iteration = 0;
  // One batch at a time, so the profile of a size holds only its own images.
  int64_t held_batch = 0, held_labels = 0;
  SyntheticBatch held;
};

SyntheticStepRunner::SyntheticStepRunner(const ModelConfig& config, int64_t imgsz, int64_t labels_per_image,
                                         const torch::Device& device, bool channels_last, bool amp,
                                         c10::ScalarType cuda_amp_dtype)
    : state_(std::make_unique<State>()) {
  state_->device = device;
  state_->imgsz = imgsz;
  state_->labels_per_image = labels_per_image;
  TrainCoreConfig core_config;
  core_config.optim.optimizer = "SGD";
  core_config.optim.warmup_epochs = 0;
  core_config.optim.nbs = 1;  // step the optimizer every iteration: its state is part of the peak
  core_config.shape = RunShape{1000, 1, 100, config.nc};
  core_config.batches_per_epoch = 1000;
  core_config.channels_last = channels_last;
  core_config.device = device;
  core_config.amp = amp && device.is_cuda();
  core_config.cuda_amp_dtype = cuda_amp_dtype;
  state_->core = std::make_unique<TrainingCore>(DetectionModel(config), DetectionModel(config), core_config);
}

SyntheticStepRunner::~SyntheticStepRunner() = default;

const SyntheticBatch& SyntheticStepRunner::batch(int batch, int64_t labels_per_image) {
  if (labels_per_image < 0) labels_per_image = state_->labels_per_image;
  if (state_->held_batch != batch || state_->held_labels != labels_per_image) {
    state_->held = SyntheticBatch{};  // freed before the next is made: never two batches at once
    state_->held = device_batch(batch, state_->imgsz, state_->core->model()->nc(), labels_per_image,
                                static_cast<uint64_t>(batch), state_->device);
    state_->held_batch = batch;
    state_->held_labels = labels_per_image;
  }
  return state_->held;
}

void SyntheticStepRunner::train_step(int batch) {
  const SyntheticBatch& data = this->batch(batch);
  state_->core->model()->train();
  state_->core->step(0, state_->iteration++, data.images, data.labels);
}

void SyntheticStepRunner::validation_step(int batch) {
  torch::NoGradGuard no_grad;
  const SyntheticBatch& data = this->batch(batch, 1);
  DetectionModel& ema = state_->core->ema_model();
  ema->eval();
  const DetectOutput output = ema->forward(state_->core->prepare_images(data.images));
  (void)output;
}

}  // namespace yolo8
