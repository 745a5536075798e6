#include "trainer/batch/batch_size.h"

#ifdef YOLO8_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

#include <algorithm>
#include <iostream>

#include "trainer/core/autocast.h"
#include "trainer/core/memory_meter.h"
#include "trainer/core/memory_model.h"
#include "trainer/core/stop_signal.h"
#include "trainer/core/synthetic_step.h"

namespace yolo8 {

double memory_budget_bytes(const Settings& settings, const torch::Device& device, double lease_gib) {
  if (lease_gib > 0) return lease_gib * kBytesPerGib;
  if (settings.lease.gpu_mem > 0) return settings.lease.gpu_mem * kBytesPerGib;
  return static_cast<double>(default_memory_budget_bytes(device));
}

AutoBatchResult auto_batch_for(const ModelConfig& config, const Settings& settings, const torch::Device& device,
                               double budget_bytes, int max_batch) {
  const BatchSpec spec = parse_batch_spec(settings.batch);
  MemoryMeter meter(device);
  SyntheticStepRunner runner(config, settings.loader.imgsz, 8, device, settings.channels_last, settings.amp,
                             cuda_autocast_dtype(settings.amp_dtype));
  AutoBatchOptions options;
  options.budget_fraction = spec.budget_fraction;
  options.imgsz = settings.loader.imgsz;
  options.nominal_batch = settings.optim.nbs;
  options.max_batch = std::max(1, max_batch);
  options.device = device;
  // Flushed: sizing takes a while and its progress must reach a piped log (kubectl logs) as it happens.
  options.log = [](const std::string& line) { std::cout << "  " << line << std::endl; };  // lines name auto-batch
  // Each trial step first checks for a stop: sizing takes several steps, a SIGTERM must not wait for all of them.
  options.validation_step = [&](int batch) {
    throw_if_stop_requested("sizing the batch");
    return measure_peak_bytes(meter, [&] { runner.validation_step(batch); });
  };
  return choose_batch(
      [&](int batch) {
        throw_if_stop_requested("sizing the batch");
        return measure_peak_bytes(meter, [&] { runner.train_step(batch); });
      },
      budget_bytes, options);
}

std::string device_name(const torch::Device& device) {
#ifdef YOLO8_WITH_CUDA
  if (device.is_cuda()) {
    return at::cuda::getDeviceProperties(static_cast<c10::DeviceIndex>(device.has_index() ? device.index() : 0))->name;
  }
#endif
  return device.is_cuda() ? "cuda" : "cpu";
}

torch::Device profile_device(const Settings& settings) {
#ifdef YOLO8_WITH_CUDA
  if (!settings.device_ids().empty()) return torch::Device(torch::kCUDA, settings.device_ids().front());
  if (settings.device != "cpu" && torch::cuda::is_available()) return torch::Device(torch::kCUDA, 0);
#else
  (void)settings;
#endif
  return torch::kCPU;
}

}  // namespace yolo8
