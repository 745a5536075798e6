#include "trainer/app/profile_mode.h"

#include <torch/version.h>
#ifdef YOLO8_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

#include <unistd.h>

#include <algorithm>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>

#include "trainer/app/run_dir.h"
#include "trainer/app/threads.h"
#include "trainer/app/utilisation.h"
#include "trainer/core/atomic_file.h"
#include "trainer/core/autocast.h"
#include "trainer/core/exit_codes.h"
#include "trainer/core/memory_meter.h"
#include "trainer/core/memory_model.h"
#include "trainer/core/stop_signal.h"
#include "trainer/core/synthetic_step.h"

namespace yolo8 {
namespace fs = std::filesystem;

namespace {}  // namespace

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

int run_profile(const Settings& settings, const std::vector<std::string>& variants, const std::vector<int>& batches) {
  configure_threads(settings);
  const torch::Device device = profile_device(settings);
  const fs::path run_dir =
      make_run_dir(project_dir(settings.project, settings.task), "profile", settings.name, settings.exist_ok);
  MemoryMeter meter(device);
  MemoryTable table;
  table.reference_imgsz = 640;
  const std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof(date), "%Y-%m-%d", std::gmtime(&now));
  table.source = "yolo8 profile at imgsz " + std::to_string(settings.loader.imgsz) +
                 (device.is_cuda() ? "" : " (CPU: the instrumented allocator's count)");
  table.provenance.device = device_name(device);
  table.provenance.precision = !(settings.amp && device.is_cuda()) ? "float32"  // profiles time the float32 step on CPU
                               : settings.amp_dtype == "bfloat16"  ? "amp_bfloat16"
                                                                   : "amp";
  table.provenance.libtorch = TORCH_VERSION;
  table.provenance.date = date;
  ProfileOptions options;
  // nvidia-smi's view of this process (CUDA context and library workspaces included), beside the allocator's.
  std::unique_ptr<Nvml> nvml = device.is_cuda() ? Nvml::load() : nullptr;
  const std::optional<std::string> nvml_device =
      nvml ? cuda_device_uuid(device.has_index() ? device.index() : 0) : std::nullopt;
  if (nvml && nvml_device) {
    const auto pid = static_cast<unsigned int>(getpid());
    options.process_bytes = [&nvml, &nvml_device, pid]() -> int64_t {
      const std::optional<double> gib = nvml->process_memory_gib(*nvml_device, pid);
      return gib ? static_cast<int64_t>(*gib * kBytesPerGib) : -1;
    };
  }
  const fs::path json_path = run_dir / "profile.json";
  const std::string table_path = settings.out.empty() ? (run_dir / "memory-table.yaml").string() : settings.out;
  std::string json;
  for (size_t v = 0; v < variants.size(); ++v) {
    const std::string& variant = variants[v];
    const ModelConfig config = load_model_config(variant, 80);
    std::vector<StepProfile> rows;
    {
      SyntheticStepRunner runner(config, settings.loader.imgsz, 8, device, settings.channels_last, settings.amp,
                                 cuda_autocast_dtype(settings.amp_dtype));
      rows = profile_steps(
          meter, [&](int batch) { runner.train_step(batch); }, batches, settings.loader.imgsz, options);
    }
    // The next variant starts from an empty cache, as a fresh process would.
    release_cached_memory(device);
    std::cout << format_profile_table(variant, rows) << std::flush;
    json += (v ? "," : "") + profile_json(variant, device.str(), rows);
    bool any_fit = false;
    for (const auto& row : rows) {
      any_fit = any_fit || !row.out_of_memory;
      // The largest seen: a share must cover the context and the libraries' workspaces at any batch.
      if (row.process_overhead_bytes >= 0) {
        table.process_overhead_gib =
            std::max(table.process_overhead_gib, static_cast<double>(row.process_overhead_bytes) / kBytesPerGib);
      }
    }
    if (any_fit) table.variants.push_back(to_table_row(fs::path(variant).stem().string(), fit_profile(rows)));
    // Written after each variant: a profile stopped at its time limit keeps what it measured.
    write_file_atomic(json_path.string(), "[" + json + "]\n");
    write_memory_table(table_path, table);
    std::cout << "Profile written to " << json_path.string() << "; memory table (for quotad) to " << table_path << " ("
              << v + 1 << " of " << variants.size() << " variants)\n"
              << std::flush;
  }
  return kExitCompleted;
}

}  // namespace yolo8
