#pragma once
// Batch sizing, as `yolo8 train` (batch=auto, -1 or a fraction) and `yolo8 profile` use it: the memory budget a run
// has and the largest batch that fits it, measured with synthetic training steps on the device.

#include <torch/torch.h>

#include <string>

#include "models/yolo.h"
#include "trainer/cli/settings.h"
#include "trainer/core/auto_batch.h"

namespace yolo8 {

// The device's name as the memory table's provenance gives it: the CUDA device name ("NVIDIA H200"), or "cpu".
std::string device_name(const torch::Device& device);

// The device a profile runs on: device=N (or the first of a list) on CUDA, else the CPU.
torch::Device profile_device(const Settings& settings);

// Memory budget in bytes for the run: the lease's memory, else gpu_mem GiB, else the device's memory.
double memory_budget_bytes(const Settings& settings, const torch::Device& device, double lease_gib = 0.0);

// batch=auto / -1 / fraction: the largest batch whose full step and validation at twice the batch fit the budget.
AutoBatchResult auto_batch_for(const ModelConfig& config, const Settings& settings, const torch::Device& device,
                               double budget_bytes, int max_batch);

}  // namespace yolo8
