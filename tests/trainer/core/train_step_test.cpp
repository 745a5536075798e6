#include "trainer/core/train_step.h"

#include <gtest/gtest.h>

#include <limits>
#include <map>
#include <sstream>

#include "trainer/core/auto_batch.h"
#include "trainer/core/autocast.h"
#include "trainer/core/checkpoint.h"
#include "trainer/core/memory_meter.h"
#include "trainer/core/synthetic_step.h"

namespace yolo8 {
namespace {

TrainingCore make_core(int64_t batch, bool scale_loss = false, bool amp = false,
                       const torch::Device& device = torch::kCPU) {
  const ModelConfig config = load_model_config("yolov8n.yaml", 3);
  TrainCoreConfig core_config;
  core_config.device = device;
  if (scale_loss) core_config.loss_scaling = LossScaling::kOn;
  core_config.amp = amp;
  core_config.shape = RunShape{64, batch, 10, 3};
  core_config.batches_per_epoch = 8;
  core_config.optim.optimizer = "SGD";
  core_config.optim.warmup_epochs = 0;
  core_config.optim.nbs = batch;  // an optimizer step every iteration
  torch::manual_seed(0);
  DetectionModel model(config);
  return TrainingCore(model, DetectionModel(config), core_config);
}

TEST(TrainStep, StepsTheOptimizerAndMovesTheWeights) {
  TrainingCore core = make_core(4);
  const SyntheticBatch batch = synthetic_batch(4, 64, 3, 3, 1);
  const torch::Tensor before = core.model()->parameters()[0].clone();
  const StepOutcome outcome = core.step(0, 0, batch.images, batch.labels);
  EXPECT_TRUE(outcome.optimizer_stepped);
  EXPECT_EQ(outcome.loss_items.numel(), 3);
  EXPECT_GT(outcome.loss_items.sum().item<double>(), 0.0);
  EXPECT_FALSE(torch::equal(before, core.model()->parameters()[0]));
  EXPECT_EQ(core.ema().updates(), 1);
}

TEST(TrainStep, DflProjectionStaysFrozen) {
  TrainingCore core = make_core(2);
  for (const auto& item : core.model()->named_parameters()) {
    if (item.key().find(".dfl.") != std::string::npos) {
      EXPECT_FALSE(item.value().requires_grad()) << item.key();
    }
  }
}

// LibTorch 2.x's zero_grad sets gradients to None (1.13 zeroed them), as Python's torch 2.x does for Ultralytics.
// A parameter without a gradient is skipped by the optimizer: a frozen layer and the DFL projection get neither
// weight decay nor momentum, however many steps run, while the trained layers move.
TEST(TrainStep, FrozenLayersGetNeitherDecayNorMomentumAndGradientsAreCleared) {
  const ModelConfig config = load_model_config("yolov8n.yaml", 3);
  TrainCoreConfig core_config;
  core_config.shape = RunShape{64, 2, 10, 3};
  core_config.batches_per_epoch = 8;
  core_config.optim.optimizer = "SGD";
  core_config.optim.warmup_epochs = 0;
  core_config.optim.weight_decay = 0.05;  // large, so an applied decay would show at once
  core_config.optim.nbs = 2;
  core_config.freeze_layers = {0};
  torch::manual_seed(0);
  TrainingCore core{DetectionModel(config), DetectionModel(config), core_config};
  std::map<std::string, torch::Tensor> before;
  for (const auto& item : core.model()->named_parameters()) before[item.key()] = item.value().detach().clone();
  const SyntheticBatch batch = synthetic_batch(2, 64, 3, 3, 1);
  for (int64_t i = 0; i < 3; ++i) ASSERT_TRUE(core.step(0, i, batch.images, batch.labels).optimizer_stepped);
  int64_t frozen = 0, moved = 0;
  for (const auto& item : core.model()->named_parameters()) {
    const bool is_frozen = item.key().rfind("model.0.", 0) == 0 || item.key().find(".dfl.") != std::string::npos;
    EXPECT_FALSE(item.value().grad().defined()) << item.key() << ": zero_grad must leave no gradient";
    if (is_frozen) {
      ++frozen;
      EXPECT_TRUE(torch::equal(before[item.key()], item.value())) << item.key() << " changed while frozen";
      EXPECT_EQ(core.optimizer().state().count(item.value().unsafeGetTensorImpl()), 0u)
          << item.key() << " has a momentum buffer";
    } else if (!torch::equal(before[item.key()], item.value())) {
      ++moved;
    }
  }
  EXPECT_EQ(frozen, 4);  // model.0.conv.weight, model.0.bn.weight, model.0.bn.bias, model.22.dfl.conv.weight
  EXPECT_GT(moved, 100);
}

TEST(TrainStep, FreezeSettingParsesCountsAndLists) {
  EXPECT_EQ(freeze_layer_indices("3"), (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(freeze_layer_indices("0,5"), (std::vector<int64_t>{0, 5}));
  EXPECT_EQ(freeze_layer_indices("[7]"), (std::vector<int64_t>{7}));
  EXPECT_TRUE(freeze_layer_indices("").empty());
}

// The out-of-memory fallback: two passes of half the batch fit where one full pass does not, and give
// nearly the gradient of the full pass (the loss normalises per pass, so not bitwise). At 128 px the activations
// outweigh what does not scale with the batch (oneDNN's scratch buffers, whose size depends on the CPU's kernels:
// at 64 px an AVX2-only CPU measured the half passes 2 MB above the full one).
TEST(TrainStep, ChunkedStepFitsWhereTheFullBatchDoesNot) {
  const SyntheticBatch batch = synthetic_batch(8, 128, 3, 3, 2);
  MemoryMeter meter(torch::kCPU);
  TrainingCore core = make_core(8);
  core.step(0, 0, batch.images, batch.labels);  // creates the optimizer state outside the measurement
  const int64_t full_peak = measure_peak_bytes(meter, [&] { core.step(0, 1, batch.images, batch.labels); });
  const int64_t half_peak = measure_peak_bytes(meter, [&] { core.step(0, 2, batch.images, batch.labels, 2); });
  ASSERT_LT(half_peak, full_peak);
  set_cpu_memory_cap((half_peak + full_peak) / 2);
  EXPECT_THROW(core.step(0, 3, batch.images, batch.labels), OutOfMemory);
  core.optimizer().zero_grad();
  EXPECT_NO_THROW(core.step(0, 3, batch.images, batch.labels, 2));
  set_cpu_memory_cap(0);
}

// A power-of-two loss scale commutes with every rounding step, so the scaler (without autocast) trains the
// same weights as the plain path.
TEST(TrainStepAmp, ForcedScalerGivesTheSameWeights) {
  TrainingCore plain = make_core(4);
  TrainingCore scaled = make_core(4, /*scale_loss=*/true);
  ASSERT_FALSE(plain.grad_scaler().enabled());
  ASSERT_TRUE(scaled.grad_scaler().enabled());
  EXPECT_FALSE(scaled.autocast());
  for (int64_t ni = 0; ni < 3; ++ni) {
    const SyntheticBatch batch = synthetic_batch(4, 64, 3, 3, static_cast<uint64_t>(10 + ni));
    const StepOutcome a = plain.step(0, ni, batch.images, batch.labels);
    const StepOutcome b = scaled.step(0, ni, batch.images, batch.labels);
    EXPECT_TRUE(b.optimizer_stepped);
    EXPECT_FALSE(b.skipped_non_finite);
    EXPECT_TRUE(torch::allclose(a.loss_items, b.loss_items, 1e-6, 1e-7));
  }
  EXPECT_EQ(scaled.grad_scaler().state().growth_tracker, 3);
  const auto pa = plain.model()->named_parameters();
  const auto pb = scaled.model()->named_parameters();
  double worst = 0.0;
  for (const auto& item : pa) {
    const torch::Tensor diff = (item.value() - pb[item.key()]).abs().max();
    worst = std::max(worst, diff.item<double>());
    EXPECT_TRUE(torch::allclose(item.value(), pb[item.key()], 1e-6, 1e-6)) << item.key();
  }
  const auto ea = plain.ema_model()->named_parameters();
  const auto eb = scaled.ema_model()->named_parameters();
  for (const auto& item : ea) EXPECT_TRUE(torch::allclose(item.value(), eb[item.key()], 1e-6, 1e-6)) << item.key();
  EXPECT_EQ(plain.ema().updates(), scaled.ema().updates());
  std::ostringstream worst_text;
  worst_text << std::scientific << worst;
  RecordProperty("max_abs_weight_difference", worst_text.str());
}

TEST(TrainStepAmp, NonFiniteGradientSkipsTheStepAndKeepsWeightsAndEma) {
  TrainingCore core = make_core(4, /*scale_loss=*/true);
  const SyntheticBatch batch = synthetic_batch(4, 64, 3, 3, 1);
  core.step(0, 0, batch.images, batch.labels);  // optimizer state exists, EMA has one update
  std::vector<torch::Tensor> weights, ema_weights;
  for (const auto& p : core.model()->parameters()) weights.push_back(p.clone());
  for (const auto& p : core.ema_model()->parameters()) ema_weights.push_back(p.clone());
  const int64_t ema_updates = core.ema().updates();
  const double scale = core.grad_scaler().current_scale();

  torch::Tensor target = core.model()->parameters()[0];
  ASSERT_TRUE(target.requires_grad());
  const unsigned hook =
      target.register_hook([](const torch::Tensor& grad) { return grad * std::numeric_limits<float>::infinity(); });
  const StepOutcome outcome = core.step(0, 1, batch.images, batch.labels);
  target.remove_hook(hook);
  EXPECT_FALSE(outcome.optimizer_stepped);
  EXPECT_TRUE(outcome.skipped_non_finite);
  EXPECT_EQ(core.grad_scaler().current_scale(), scale / 2);
  EXPECT_EQ(core.ema().updates(), ema_updates);
  const auto after = core.model()->parameters();
  for (size_t i = 0; i < weights.size(); ++i) EXPECT_TRUE(torch::equal(weights[i], after[i])) << "parameter " << i;
  const auto ema_after = core.ema_model()->parameters();
  for (size_t i = 0; i < ema_weights.size(); ++i) EXPECT_TRUE(torch::equal(ema_weights[i], ema_after[i])) << i;
  // The poisoned gradients are dropped; the next clean step trains again.
  const StepOutcome next = core.step(0, 2, batch.images, batch.labels);
  EXPECT_TRUE(next.optimizer_stepped);
  EXPECT_EQ(core.ema().updates(), ema_updates + 1);
  EXPECT_FALSE(torch::equal(weights[0], core.model()->parameters()[0]));
  EXPECT_TRUE(torch::isfinite(core.model()->parameters()[0]).all().item<bool>());
}

// batch 2 with nbs 4 accumulates two iterations; growth_interval 1 moves the scale at every optimizer step.
TrainingCore make_scaled_core() {
  const ModelConfig config = load_model_config("yolov8n.yaml", 3);
  TrainCoreConfig core_config;
  core_config.loss_scaling = LossScaling::kOn;
  core_config.grad_scaler.growth_interval = 1;
  core_config.shape = RunShape{64, 2, 10, 3};
  core_config.batches_per_epoch = 32;
  core_config.optim.optimizer = "SGD";
  core_config.optim.warmup_epochs = 0;
  core_config.optim.nbs = 4;
  torch::manual_seed(0);
  DetectionModel model(config);
  return TrainingCore(model, DetectionModel(config), core_config);
}

void run_iterations(TrainingCore& core, int64_t first, int64_t last) {
  for (int64_t ni = first; ni < last; ++ni) {
    const SyntheticBatch batch = synthetic_batch(2, 64, 3, 3, static_cast<uint64_t>(20 + ni));
    core.step(0, ni, batch.images, batch.labels);
  }
}

// Stopped in the middle of an accumulation window, the stored gradients are scaled: the resumed run must scale
// with the same factor to end bitwise where the uninterrupted run does.
TEST(TrainStepAmp, ScaledRunResumesMidAccumulationBitwise) {
  TrainingCore uninterrupted = make_scaled_core();
  run_iterations(uninterrupted, 0, 5);
  EXPECT_EQ(uninterrupted.grad_scaler().current_scale(), 65536.0 * 4);  // two clean steps, growth after each

  TrainingCore first = make_scaled_core();
  run_iterations(first, 0, 3);  // step at ni 1, ni 2 accumulated
  CheckpointState state;
  state.schedule = first.schedule().state();
  state.has_grad_scaler = true;
  state.grad_scaler = first.grad_scaler().state();
  CheckpointSources sources;
  sources.model = first.model().ptr().get();
  sources.ema = &first.ema();
  sources.optimizer = &first.optimizer();
  sources.include_grads = true;
  const std::vector<char> bytes = encode_checkpoint(state, sources);

  torch::manual_seed(123);  // different initial weights: everything must come from the checkpoint
  TrainingCore resumed = make_scaled_core();
  CheckpointTargets targets;
  targets.model = resumed.model().ptr().get();
  targets.ema = &resumed.ema();
  targets.optimizer = &resumed.optimizer();
  const CheckpointState loaded = decode_checkpoint(bytes, targets);
  to_channels_last(*resumed.model());
  to_channels_last(*resumed.ema_model());
  resumed.schedule().restore(loaded.schedule);
  ASSERT_TRUE(loaded.has_grad_scaler);
  resumed.grad_scaler().restore(loaded.grad_scaler);
  run_iterations(resumed, 3, 5);

  EXPECT_EQ(resumed.grad_scaler().current_scale(), uninterrupted.grad_scaler().current_scale());
  const auto a = uninterrupted.model()->named_parameters();
  const auto b = resumed.model()->named_parameters();
  for (const auto& item : a) EXPECT_TRUE(torch::equal(item.value(), b[item.key()])) << item.key();
  const auto ea = uninterrupted.ema_model()->named_parameters();
  const auto eb = resumed.ema_model()->named_parameters();
  for (const auto& item : ea) EXPECT_TRUE(torch::equal(item.value(), eb[item.key()])) << item.key();
}

// amp on a CPU with native bfloat16 runs the forward under bfloat16 autocast (no scaler: bfloat16 has float32's
// range); the losses agree with float32 to bfloat16's precision and the weights move differently. Elsewhere the
// step is the float32 one, bit for bit.
TEST(TrainStepAmp, AmpOnCpuIsBfloat16WhereTheCpuHasItElseThePlainStep) {
  TrainingCore plain = make_core(4);
  TrainingCore amp = make_core(4, /*scale_loss=*/false, /*amp=*/true);
  EXPECT_FALSE(amp.grad_scaler().enabled());
  EXPECT_EQ(amp.autocast(), cpu_has_native_bfloat16());
  const SyntheticBatch batch = synthetic_batch(4, 64, 3, 3, 5);
  const StepOutcome a = plain.step(0, 0, batch.images, batch.labels);
  const StepOutcome b = amp.step(0, 0, batch.images, batch.labels);
  const auto pa = plain.model()->parameters();
  const auto pb = amp.model()->parameters();
  bool all_equal = true;
  for (size_t i = 0; i < pa.size(); ++i) all_equal = all_equal && torch::equal(pa[i], pb[i]);
  if (!cpu_has_native_bfloat16()) {
    EXPECT_TRUE(all_equal);
    return;
  }
  EXPECT_FALSE(all_equal);
  EXPECT_TRUE(torch::isfinite(b.loss_items).all().item<bool>());
  EXPECT_TRUE(torch::allclose(a.loss_items, b.loss_items, 3e-2, 1e-3)) << a.loss_items << " vs " << b.loss_items;
}

// The decision alone: CUDA always (in CUDA builds), a CPU only with native bfloat16, nothing without amp.
TEST(TrainStepAmp, AutocastAppliesWhereTheHardwareComputesInLowPrecision) {
  EXPECT_FALSE(autocast_applies(false, c10::DeviceType::CPU, true));
  EXPECT_TRUE(autocast_applies(true, c10::DeviceType::CPU, true));
  EXPECT_FALSE(autocast_applies(true, c10::DeviceType::CPU, false));
#ifdef YOLO8_WITH_CUDA
  EXPECT_TRUE(autocast_applies(true, c10::DeviceType::CUDA, false));
#endif
  EXPECT_FALSE(autocast_applies(false, c10::DeviceType::CUDA, true));
}

// Loss scaling is float16's need alone: bfloat16 has float32's exponent range, and the CPU never scales.
TEST(TrainStepAmp, OnlyFloat16AutocastOnCudaScalesTheLoss) {
  TrainCoreConfig config;
  config.amp = true;
  config.device = torch::Device(torch::kCUDA, 0);  // a value only: nothing is allocated
  EXPECT_TRUE(loss_scaling_applies(config));
  config.cuda_amp_dtype = c10::ScalarType::BFloat16;
  EXPECT_FALSE(loss_scaling_applies(config));
  config.cuda_amp_dtype = c10::ScalarType::Half;
  config.amp = false;
  EXPECT_FALSE(loss_scaling_applies(config));
  config.amp = true;
  config.device = torch::kCPU;
  EXPECT_FALSE(loss_scaling_applies(config));
  EXPECT_EQ(cuda_autocast_dtype("bfloat16"), c10::ScalarType::BFloat16);
  EXPECT_EQ(cuda_autocast_dtype("float16"), c10::ScalarType::Half);
  EXPECT_THROW(cuda_autocast_dtype("fp8"), std::invalid_argument);
}

// ---------------------------------------------------------------------------------------------------------
// On a GPU: float32 agrees with the CPU step, and AMP trains with finite losses in less memory. Skipped where no
// CUDA device is present (every CPU machine, CI included); scripts/gpu_check.sh runs them.

bool have_cuda() {
#ifdef YOLO8_WITH_CUDA
  return torch::cuda::is_available();
#else
  return false;
#endif
}

TEST(TrainStepCuda, Float32StepAgreesWithTheCpuStep) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device";
  // A float32 comparison: TF32 (cuDNN's default for convolutions) rounds inputs to 10 mantissa bits, which would
  // measure TF32 rather than the CUDA path. Restored afterwards for the other tests of this process.
  at::Context& context = at::globalContext();
  const bool cudnn_tf32 = context.allowTF32CuDNN();
  const bool cublas_tf32 = context.allowTF32CuBLAS();
  context.setAllowTF32CuDNN(false);
  context.setAllowTF32CuBLAS(false);
  TrainingCore cpu = make_core(4);
  TrainingCore gpu = make_core(4, false, false, torch::Device(torch::kCUDA, 0));
  for (int64_t ni = 0; ni < 2; ++ni) {
    const SyntheticBatch batch = synthetic_batch(4, 128, 3, 4, static_cast<uint64_t>(ni));
    const StepOutcome a = cpu.step(0, ni, batch.images, batch.labels);
    const StepOutcome b = gpu.step(0, ni, batch.images, batch.labels);
    // Summation order differs (cuDNN's and oneDNN's kernels): agreement to float32 rounding of long sums.
    EXPECT_TRUE(torch::allclose(a.loss_items, b.loss_items.to(torch::kCPU), 1e-4, 1e-5))
        << a.loss_items << " vs " << b.loss_items;
  }
  context.setAllowTF32CuDNN(cudnn_tf32);
  context.setAllowTF32CuBLAS(cublas_tf32);
}

TEST(TrainStepCuda, AmpTrainsWithFiniteLossesInLessMemory) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device";
  const torch::Device device(torch::kCUDA, 0);
  MemoryMeter meter(device);
  int64_t peaks[2] = {0, 0};
  for (bool amp : {false, true}) {
    TrainingCore core = make_core(16, false, amp, device);
    EXPECT_EQ(core.autocast(), amp);
    EXPECT_EQ(core.grad_scaler().enabled(), amp);
    // The scaler starts at 2^16 and the loss is the batch's sum: fresh yolov8n gradients reach 7-8, so fp16
    // overflows and the first steps are skipped while the scale halves. That is the scaler working; what must
    // hold is that once a step is taken, training goes on (at most one later skip) and the loss falls.
    int stepped = 0, skipped_before = 0, skipped_after = 0;
    torch::Tensor first_loss, last_loss;
    for (int64_t ni = 0; ni < 12; ++ni) {
      const SyntheticBatch batch = synthetic_batch(16, 320, 3, 6, 7);  // one batch, so the loss must fall
      StepOutcome outcome;
      const int64_t peak = measure_peak_bytes(meter, [&] { outcome = core.step(0, ni, batch.images, batch.labels); });
      if (ni > 0) peaks[amp] = std::max(peaks[amp], peak);  // after the optimizer state exists
      ASSERT_TRUE(torch::isfinite(outcome.loss_items).all().item<bool>()) << "amp " << amp << " step " << ni;
      if (outcome.optimizer_stepped) {
        if (stepped == 0) first_loss = outcome.loss_items.sum().cpu();
        ++stepped;
      } else {
        ++(stepped == 0 ? skipped_before : skipped_after);
      }
      last_loss = outcome.loss_items.sum().cpu();
    }
    std::printf("%s: %d steps taken, %d skipped before the first, %d after; scale %g\n", amp ? "AMP" : "float32",
                stepped, skipped_before, skipped_after, core.grad_scaler().current_scale());
    if (!amp) EXPECT_EQ(stepped, 12);
    EXPECT_LE(skipped_before, 8) << "amp " << amp;  // 2^16 halved 8 times is 256: gradients of 256 x 8 fit fp16
    EXPECT_LE(skipped_after, 1) << "amp " << amp;
    ASSERT_GE(stepped, 3) << "amp " << amp;
    EXPECT_LT(last_loss.item<double>(), first_loss.item<double>()) << "amp " << amp;
    for (const auto& p : core.model()->parameters()) ASSERT_TRUE(torch::isfinite(p).all().item<bool>());
  }
  std::printf("peak of a yolov8n step at batch 16, imgsz 320: float32 %.1f MiB, AMP %.1f MiB\n", peaks[0] / 1048576.0,
              peaks[1] / 1048576.0);
  EXPECT_LT(peaks[1], peaks[0]);
}

// bfloat16 autocast (amp_dtype=bfloat16, compute capability 8.0+): no loss scaling, so every step is taken from the
// first, and the loss falls; its memory is float16's, not float32's.
TEST(TrainStepCuda, Bfloat16AmpTakesEveryStepWithoutScaling) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device";
  if (!cuda_device_has_bfloat16(0)) GTEST_SKIP() << "this GPU does not compute in bfloat16";
  const torch::Device device(torch::kCUDA, 0);
  MemoryMeter meter(device);
  const ModelConfig model_config = load_model_config("yolov8n.yaml", 3);
  TrainCoreConfig config;
  config.device = device;
  config.amp = true;
  config.cuda_amp_dtype = c10::ScalarType::BFloat16;
  config.shape = RunShape{64, 16, 10, 3};
  config.batches_per_epoch = 8;
  config.optim.optimizer = "SGD";
  config.optim.warmup_epochs = 0;
  config.optim.nbs = 16;
  torch::manual_seed(0);
  DetectionModel model(model_config);
  TrainingCore core(model, DetectionModel{model_config}, config);
  EXPECT_TRUE(core.autocast());
  EXPECT_FALSE(core.grad_scaler().enabled());
  torch::Tensor first_loss, last_loss;
  int64_t peak = 0;
  for (int64_t ni = 0; ni < 6; ++ni) {
    const SyntheticBatch batch = synthetic_batch(16, 320, 3, 6, 7);
    StepOutcome outcome;
    const int64_t step_peak =
        measure_peak_bytes(meter, [&] { outcome = core.step(0, ni, batch.images, batch.labels); });
    if (ni > 0) peak = std::max(peak, step_peak);
    ASSERT_TRUE(torch::isfinite(outcome.loss_items).all().item<bool>()) << "step " << ni;
    EXPECT_TRUE(outcome.optimizer_stepped) << "step " << ni;
    if (ni == 0) first_loss = outcome.loss_items.sum().cpu();
    last_loss = outcome.loss_items.sum().cpu();
  }
  std::printf("bfloat16: 6 of 6 steps taken; peak of a yolov8n step at batch 16, imgsz 320: %.1f MiB\n",
              peak / 1048576.0);
  EXPECT_LT(last_loss.item<double>(), first_loss.item<double>());
}

}  // namespace
}  // namespace yolo8
