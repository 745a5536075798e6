#include "trainer/app/utilisation.h"

#include <dlfcn.h>

#ifdef YOLO8_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <sstream>
#include <type_traits>
#include <utility>

namespace yolo8 {

namespace {

// The few NVML declarations used (nvml.h, stable since CUDA 10): return codes are ints, 0 is success.
using NvmlDevice = void*;
struct NvmlUtilization {
  unsigned int gpu;
  unsigned int memory;
};
struct NvmlMemory {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};
constexpr double kGib = 1024.0 * 1024.0 * 1024.0;

}  // namespace

struct Nvml::Api {
  void* library = nullptr;
  int (*init)() = nullptr;
  int (*shutdown)() = nullptr;
  int (*by_index)(unsigned int, NvmlDevice*) = nullptr;
  int (*by_uuid)(const char*, NvmlDevice*) = nullptr;
  int (*utilization)(NvmlDevice, NvmlUtilization*) = nullptr;
  int (*memory)(NvmlDevice, NvmlMemory*) = nullptr;
};

Nvml::Nvml(std::unique_ptr<Api> api) : api_(std::move(api)) {}

Nvml::~Nvml() {
  api_->shutdown();
  dlclose(api_->library);
}

std::unique_ptr<Nvml> Nvml::load(const std::string& library, std::string* why) {
  const auto fail = [&](const std::string& reason) -> std::unique_ptr<Nvml> {
    if (why) *why = reason;
    return nullptr;
  };
  auto api = std::make_unique<Api>();
  api->library = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!api->library) {
    const char* error = dlerror();
    return fail(error ? error : "cannot open " + library);
  }
  const auto bind = [&](auto& function, const char* name) {
    function = reinterpret_cast<std::remove_reference_t<decltype(function)>>(dlsym(api->library, name));
    return function != nullptr;
  };
  for (const auto& [ok, name] :
       {std::pair{bind(api->init, "nvmlInit_v2"), "nvmlInit_v2"},
        std::pair{bind(api->shutdown, "nvmlShutdown"), "nvmlShutdown"},
        std::pair{bind(api->by_index, "nvmlDeviceGetHandleByIndex_v2"), "nvmlDeviceGetHandleByIndex_v2"},
        std::pair{bind(api->by_uuid, "nvmlDeviceGetHandleByUUID"), "nvmlDeviceGetHandleByUUID"},
        std::pair{bind(api->utilization, "nvmlDeviceGetUtilizationRates"), "nvmlDeviceGetUtilizationRates"},
        std::pair{bind(api->memory, "nvmlDeviceGetMemoryInfo"), "nvmlDeviceGetMemoryInfo"}}) {
    if (!ok) {
      dlclose(api->library);
      return fail(library + " has no " + name);
    }
  }
  if (const int status = api->init(); status != 0) {
    dlclose(api->library);
    return fail("nvmlInit_v2 failed with code " + std::to_string(status));
  }
  return std::unique_ptr<Nvml>(new Nvml(std::move(api)));
}

std::optional<Nvml::DeviceSample> Nvml::sample(const std::string& device) const {
  NvmlDevice handle = nullptr;
  const bool by_index = !device.empty() &&
                        std::all_of(device.begin(), device.end(), [](unsigned char c) { return std::isdigit(c) != 0; });
  const int found = by_index ? api_->by_index(static_cast<unsigned int>(std::stoul(device)), &handle)
                             : api_->by_uuid(device.c_str(), &handle);
  if (found != 0) return std::nullopt;
  NvmlUtilization utilization{};
  NvmlMemory memory{};
  if (api_->utilization(handle, &utilization) != 0 || api_->memory(handle, &memory) != 0) return std::nullopt;
  DeviceSample sample;
  sample.util = std::clamp(utilization.gpu / 100.0, 0.0, 1.0);
  sample.memory_used_gib = static_cast<double>(memory.used) / kGib;
  sample.memory_total_gib = static_cast<double>(memory.total) / kGib;
  return sample;
}

std::vector<std::string> nvml_device_names(const std::vector<int>& cuda_ids, const std::string& visible,
                                           const CudaUuidLookup& cuda_uuid) {
  std::vector<std::string> entries;
  std::stringstream list(visible);
  for (std::string entry; std::getline(list, entry, ',');) entries.push_back(entry);
  std::vector<std::string> names;
  for (const int id : cuda_ids) {
    if (std::optional<std::string> uuid = cuda_uuid ? cuda_uuid(id) : std::nullopt) {
      names.push_back(*uuid);
    } else if (visible.empty()) {
      names.push_back(std::to_string(id));
    } else if (id >= 0 && id < static_cast<int>(entries.size())) {
      names.push_back(entries[static_cast<size_t>(id)]);  // a physical index or a UUID, as NVML names them
    }
  }
  return names;
}

std::optional<std::string> cuda_device_uuid(int cuda_id) {
#ifdef YOLO8_WITH_CUDA
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || cuda_id < 0 || cuda_id >= count) return std::nullopt;
  cudaDeviceProp props{};
  if (cudaGetDeviceProperties(&props, cuda_id) != cudaSuccess) return std::nullopt;
  const auto* b = reinterpret_cast<const unsigned char*>(props.uuid.bytes);
  char text[48];
  std::snprintf(text, sizeof text, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
                b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
  return std::string(text);
#else
  (void)cuda_id;
  return std::nullopt;
#endif
}

UtilisationSampler::UtilisationSampler(std::unique_ptr<Nvml> nvml, std::vector<std::string> devices, double start_s)
    : nvml_(std::move(nvml)), devices_(std::move(devices)), last_now_s_(start_s) {}

UtilisationSampler::Reading UtilisationSampler::sample(double busy_seconds, double now_s) {
  Reading reading;
  const double interval = now_s - last_now_s_;
  const double busy = busy_seconds - last_busy_s_;
  last_busy_s_ = busy_seconds;
  last_now_s_ = now_s;
  reading.busy_share = interval > 0 ? std::clamp(busy / interval, 0.0, 1.0) : 0.0;
  if (nvml_ && !devices_.empty()) {
    double sum = 0, memory = 0;
    bool all = true;
    for (const auto& device : devices_) {
      const std::optional<Nvml::DeviceSample> sample = nvml_->sample(device);
      if (!sample) {
        all = false;
        break;
      }
      sum += sample->util;
      memory = std::max(memory, sample->memory_used_gib);
    }
    if (all) {
      reading.util = sum / static_cast<double>(devices_.size());
      reading.source = "nvml";
      reading.device_memory_used_gib = memory;
      return reading;
    }
  }
  reading.util = reading.busy_share;
  reading.source = "busy_time";
  return reading;
}

RanksUtilisation RanksUtilisation::from_sums(int ranks, double util_sum, double ranks_without_nvml, double busiest_gib,
                                             double now_s) {
  RanksUtilisation combined;
  combined.ranks = ranks;
  combined.all_nvml = ranks_without_nvml < 0.5;
  combined.util = ranks > 0 ? std::clamp(util_sum / ranks, 0.0, 1.0) : 0.0;
  combined.device_memory_used_gib = combined.all_nvml ? busiest_gib : -1;
  combined.combined_at_s = now_s;
  return combined;
}

UtilisationSampler::Reading with_other_ranks(const UtilisationSampler::Reading& own, const RanksUtilisation& ranks,
                                             double now_s, double interval_s) {
  if (ranks.ranks <= 1) return own;
  if (!ranks.all_nvml) {
    UtilisationSampler::Reading busy = own;
    busy.util = own.busy_share;
    busy.source = "busy_time";
    busy.device_memory_used_gib = -1;
    return busy;
  }
  if (ranks.combined_at_s < 0 || now_s - ranks.combined_at_s > interval_s) return own;
  UtilisationSampler::Reading combined = own;
  combined.util = ranks.util;
  combined.source = "nvml";
  combined.device_memory_used_gib = std::max(own.device_memory_used_gib, ranks.device_memory_used_gib);
  return combined;
}

}  // namespace yolo8
