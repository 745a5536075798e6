#include "trainer/runtime/utilisation.h"

#include <dlfcn.h>
#include <unistd.h>

#ifdef YOLO8_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <sstream>
#include <type_traits>
#include <utility>
#include <vector>

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
// nvmlMemory_v2_t: `used` leaves out the driver's reserved memory, as nvidia-smi's "Used" does since R510.
struct NvmlMemoryV2 {
  unsigned int version;
  unsigned long long total;
  unsigned long long reserved;
  unsigned long long free;
  unsigned long long used;
};
constexpr unsigned int kNvmlMemoryV2Version = static_cast<unsigned int>(sizeof(NvmlMemoryV2)) | (2U << 24U);
// nvmlProcessInfo_t of the _v2 and _v3 process queries (the same layout).
struct NvmlProcessInfo {
  unsigned int pid;
  unsigned long long used_gpu_memory;
  unsigned int gpu_instance_id;
  unsigned int compute_instance_id;
};
constexpr unsigned long long kNvmlValueNotAvailable = ~0ULL;
// nvmlSample_t of nvmlDeviceGetSamples: a CPU timestamp (microseconds since the epoch) and an 8-byte value union.
struct NvmlSample {
  unsigned long long time_stamp;
  union {
    double d;
    unsigned int ui;
    unsigned long ul;
    unsigned long long ull;
    long long sll;
  } value;
};
constexpr int kNvmlGpuUtilizationSamples = 1;  // nvmlSamplingType_t NVML_GPU_UTILIZATION_SAMPLES
enum NvmlValueType { kDouble = 0, kUnsignedInt = 1, kUnsignedLong = 2, kUnsignedLongLong = 3, kSignedLongLong = 4 };

double sample_value(const NvmlSample& sample, int type) {
  switch (type) {
    case kDouble: return sample.value.d;
    case kUnsignedLong: return static_cast<double>(sample.value.ul);
    case kUnsignedLongLong: return static_cast<double>(sample.value.ull);
    case kSignedLongLong: return static_cast<double>(sample.value.sll);
    default: return static_cast<double>(sample.value.ui);
  }
}

unsigned long long wall_clock_us() {
  return static_cast<unsigned long long>(
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count());
}
constexpr int kNvmlErrorInsufficientSize = 7;
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
  int (*memory_v2)(NvmlDevice, NvmlMemoryV2*) = nullptr;                    // optional (R510+)
  int (*processes)(NvmlDevice, unsigned int*, NvmlProcessInfo*) = nullptr;  // optional (_v3 or _v2)
  int (*samples)(NvmlDevice, int, unsigned long long, int*, unsigned int*, NvmlSample*) = nullptr;  // optional

  NvmlDevice handle(const std::string& device) const {
    NvmlDevice found = nullptr;
    const bool numeric = !device.empty() && std::all_of(device.begin(), device.end(),
                                                        [](unsigned char c) { return std::isdigit(c) != 0; });
    const int status =
        numeric ? by_index(static_cast<unsigned int>(std::stoul(device)), &found) : by_uuid(device.c_str(), &found);
    return status == 0 ? found : nullptr;
  }
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
  // Newer entry points where the driver has them: the same basis as nvidia-smi's figures.
  bind(api->memory_v2, "nvmlDeviceGetMemoryInfo_v2");
  if (!bind(api->processes, "nvmlDeviceGetComputeRunningProcesses_v3")) {
    bind(api->processes, "nvmlDeviceGetComputeRunningProcesses_v2");
  }
  bind(api->samples, "nvmlDeviceGetSamples");
  if (const int status = api->init(); status != 0) {
    dlclose(api->library);
    return fail("nvmlInit_v2 failed with code " + std::to_string(status));
  }
  return std::unique_ptr<Nvml>(new Nvml(std::move(api)));
}

std::optional<Nvml::DeviceSample> Nvml::sample(const std::string& device) const {
  NvmlDevice handle = api_->handle(device);
  if (handle == nullptr) return std::nullopt;
  NvmlUtilization utilization{};
  if (api_->utilization(handle, &utilization) != 0) return std::nullopt;
  DeviceSample sample;
  sample.util = std::clamp(utilization.gpu / 100.0, 0.0, 1.0);
  NvmlMemoryV2 memory_v2{};
  memory_v2.version = kNvmlMemoryV2Version;
  if (api_->memory_v2 != nullptr && api_->memory_v2(handle, &memory_v2) == 0) {
    sample.memory_used_gib = static_cast<double>(memory_v2.used) / kGib;
    sample.memory_total_gib = static_cast<double>(memory_v2.total) / kGib;
    sample.memory_basis = "v2";
  } else {
    NvmlMemory memory{};
    if (api_->memory(handle, &memory) != 0) return std::nullopt;
    sample.memory_used_gib = static_cast<double>(memory.used) / kGib;
    sample.memory_total_gib = static_cast<double>(memory.total) / kGib;
    sample.memory_basis = "v1";
  }
  return sample;
}

std::optional<double> Nvml::process_memory_gib(const std::string& device, unsigned int pid) const {
  NvmlDevice handle = api_->handle(device);
  if (handle == nullptr || api_->processes == nullptr) return std::nullopt;
  std::vector<NvmlProcessInfo> infos(16);
  for (int attempt = 0; attempt < 3; ++attempt) {
    auto count = static_cast<unsigned int>(infos.size());
    const int status = api_->processes(handle, &count, infos.data());
    if (status == kNvmlErrorInsufficientSize) {
      infos.resize(count + 8);  // processes came and went between the calls
      continue;
    }
    if (status != 0) return std::nullopt;
    for (unsigned int i = 0; i < count; ++i) {
      // In a container without the host's PID namespace NVML names host PIDs: ours is then not among them.
      if (infos[i].pid == pid && infos[i].used_gpu_memory != kNvmlValueNotAvailable) {
        return static_cast<double>(infos[i].used_gpu_memory) / kGib;
      }
    }
    return std::nullopt;
  }
  return std::nullopt;
}

std::optional<Nvml::UtilisationWindow> Nvml::utilisation_since(const std::string& device,
                                                               unsigned long long since_us) const {
  NvmlDevice handle = api_->handle(device);
  if (handle == nullptr || api_->samples == nullptr) return std::nullopt;
  int type = kUnsignedInt;
  unsigned int count = 0;
  if (api_->samples(handle, kNvmlGpuUtilizationSamples, since_us, &type, &count, nullptr) != 0 || count == 0) {
    return std::nullopt;  // NVML_ERROR_NOT_FOUND: no sample since then
  }
  std::vector<NvmlSample> samples(count);
  if (api_->samples(handle, kNvmlGpuUtilizationSamples, since_us, &type, &count, samples.data()) != 0) {
    return std::nullopt;
  }
  UtilisationWindow window;
  double sum = 0;
  for (unsigned int i = 0; i < count && i < samples.size(); ++i) {
    if (samples[i].time_stamp <= since_us) continue;
    sum += sample_value(samples[i], type);
    window.last_us = std::max(window.last_us, samples[i].time_stamp);
    ++window.samples;
  }
  if (window.samples == 0) return std::nullopt;
  window.util = std::clamp(sum / window.samples / 100.0, 0.0, 1.0);
  return window;
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
    : nvml_(std::move(nvml)),
      devices_(std::move(devices)),
      pid_(static_cast<unsigned int>(getpid())),
      last_seen_us_(devices_.size(), wall_clock_us()),
      last_now_s_(start_s) {}

UtilisationSampler::Reading UtilisationSampler::sample(double busy_seconds, double now_s) {
  Reading reading;
  const double interval = now_s - last_now_s_;
  const double busy = busy_seconds - last_busy_s_;
  last_busy_s_ = busy_seconds;
  last_now_s_ = now_s;
  reading.busy_share = interval > 0 ? std::clamp(busy / interval, 0.0, 1.0) : 0.0;
  if (nvml_ && !devices_.empty()) {
    double sum = 0, memory = 0, own = -1;
    bool all = true;
    for (size_t d = 0; d < devices_.size(); ++d) {
      const std::string& device = devices_[d];
      const std::optional<Nvml::DeviceSample> sample = nvml_->sample(device);
      if (!sample) {
        all = false;
        break;
      }
      // The mean of the driver's samples since the last heartbeat where it keeps them: one reading of its last
      // period (a sixth of a second on recent GPUs) lands on the idle moments of a step as often as on the busy ones,
      // and in phase with the epochs it can read 0 % for a whole run of heartbeats of a busy GPU.
      if (const std::optional<Nvml::UtilisationWindow> window = nvml_->utilisation_since(device, last_seen_us_[d])) {
        sum += window->util;
        last_seen_us_[d] = window->last_us;
      } else {
        sum += sample->util;
      }
      memory = std::max(memory, sample->memory_used_gib);
      if (const std::optional<double> mine = nvml_->process_memory_gib(device, pid_)) own = std::max(own, *mine);
    }
    if (all) {
      reading.util = sum / static_cast<double>(devices_.size());
      reading.source = "nvml";
      reading.device_memory_used_gib = memory;
      reading.process_memory_used_gib = own;
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
    busy.process_memory_used_gib = -1;
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
