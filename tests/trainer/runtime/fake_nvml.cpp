// A stand-in for libnvidia-ml.so.1 with the symbols the trainer uses, so the NVML path is tested on any machine.
// Its devices answer from environment variables the test sets: FAKE_NVML_DEVICES (count, default 2),
// FAKE_NVML_UTIL_<i> (percent), FAKE_NVML_USED_MIB_<i>, FAKE_NVML_RESERVED_MIB_<i> (the driver's reserve: counted in
// the v1 memory query's `used`, not in v2's), FAKE_NVML_PROCESSES_<i> ("pid:MiB,pid:MiB"), FAKE_NVML_SAMPLES_<i>
// ("microseconds:percent,..." utilisation samples; unset: the driver keeps none), FAKE_NVML_INIT (a return code for
// nvmlInit_v2). Device i's UUID is "GPU-fake-<i>".
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace {

struct FakeDevice {
  unsigned int index;
};
FakeDevice g_devices[16] = {{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}, {8}, {9}, {10}, {11}, {12}, {13}, {14}, {15}};

unsigned long long env_number(const std::string& name, unsigned long long fallback) {
  const char* value = std::getenv(name.c_str());
  return value ? std::strtoull(value, nullptr, 10) : fallback;
}

unsigned int device_count() { return static_cast<unsigned int>(env_number("FAKE_NVML_DEVICES", 2)); }

constexpr int kSuccess = 0;
constexpr int kInvalidArgument = 2;
constexpr int kNotSupported = 3;
constexpr int kNotFound = 6;
constexpr int kInsufficientSize = 7;

// "a:b,c:d" of environment variable `name` as pairs of numbers; empty when unset.
std::vector<std::pair<unsigned long long, unsigned long long>> env_pairs(const std::string& name) {
  std::vector<std::pair<unsigned long long, unsigned long long>> pairs;
  const char* value = std::getenv(name.c_str());
  if (value == nullptr) return pairs;
  std::stringstream list(value);
  for (std::string item; std::getline(list, item, ',');) {
    const size_t colon = item.find(':');
    if (colon == std::string::npos) continue;
    pairs.emplace_back(std::strtoull(item.substr(0, colon).c_str(), nullptr, 10),
                       std::strtoull(item.substr(colon + 1).c_str(), nullptr, 10));
  }
  return pairs;
}

std::string key(const char* prefix, const void* device) {
  return prefix + std::to_string(static_cast<const FakeDevice*>(device)->index);
}

}  // namespace

extern "C" {

struct FakeUtilization {
  unsigned int gpu;
  unsigned int memory;
};
struct FakeMemory {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};

int nvmlInit_v2() { return static_cast<int>(env_number("FAKE_NVML_INIT", kSuccess)); }
int nvmlShutdown() { return kSuccess; }

int nvmlDeviceGetHandleByIndex_v2(unsigned int index, void** device) {
  if (index >= device_count() || index >= 16) return kInvalidArgument;
  *device = &g_devices[index];
  return kSuccess;
}

int nvmlDeviceGetHandleByUUID(const char* uuid, void** device) {
  for (unsigned int i = 0; i < device_count() && i < 16; ++i) {
    if (std::string(uuid) == "GPU-fake-" + std::to_string(i)) {
      *device = &g_devices[i];
      return kSuccess;
    }
  }
  return kNotFound;
}

int nvmlDeviceGetUtilizationRates(void* device, FakeUtilization* utilization) {
  const unsigned int i = static_cast<FakeDevice*>(device)->index;
  utilization->gpu = static_cast<unsigned int>(env_number("FAKE_NVML_UTIL_" + std::to_string(i), 0));
  utilization->memory = 0;
  return kSuccess;
}

int nvmlDeviceGetMemoryInfo(void* device, FakeMemory* memory) {
  memory->total = 24ULL << 30;
  memory->used =
      (env_number(key("FAKE_NVML_USED_MIB_", device), 0) + env_number(key("FAKE_NVML_RESERVED_MIB_", device), 0)) << 20;
  memory->free = memory->total - memory->used;
  return kSuccess;
}

struct FakeMemoryV2 {
  unsigned int version;
  unsigned long long total;
  unsigned long long reserved;
  unsigned long long free;
  unsigned long long used;
};

int nvmlDeviceGetMemoryInfo_v2(void* device, FakeMemoryV2* memory) {
  if (memory->version != (static_cast<unsigned int>(sizeof(FakeMemoryV2)) | (2U << 24U))) return kInvalidArgument;
  memory->total = 24ULL << 30;
  memory->reserved = env_number(key("FAKE_NVML_RESERVED_MIB_", device), 0) << 20;
  memory->used = env_number(key("FAKE_NVML_USED_MIB_", device), 0) << 20;
  memory->free = memory->total - memory->reserved - memory->used;
  return kSuccess;
}

struct FakeProcessInfo {
  unsigned int pid;
  unsigned long long used_gpu_memory;
  unsigned int gpu_instance_id;
  unsigned int compute_instance_id;
};

int nvmlDeviceGetComputeRunningProcesses_v3(void* device, unsigned int* count, FakeProcessInfo* infos) {
  const auto processes = env_pairs(key("FAKE_NVML_PROCESSES_", device));
  if (*count < processes.size()) {
    *count = static_cast<unsigned int>(processes.size());
    return kInsufficientSize;
  }
  *count = static_cast<unsigned int>(processes.size());
  for (size_t i = 0; i < processes.size(); ++i) {
    infos[i] = {static_cast<unsigned int>(processes[i].first), processes[i].second << 20, 0, 0};
  }
  return kSuccess;
}

struct FakeSample {
  unsigned long long time_stamp;
  unsigned long long value;  // the union; utilisation is an unsigned int in its first bytes
};

int nvmlDeviceGetSamples(void* device, int type, unsigned long long since, int* value_type, unsigned int* count,
                         FakeSample* samples) {
  if (type != 1) return kNotSupported;  // utilisation only
  if (std::getenv(key("FAKE_NVML_SAMPLES_", device).c_str()) == nullptr) return kNotSupported;
  std::vector<std::pair<unsigned long long, unsigned long long>> newer;
  for (const auto& sample : env_pairs(key("FAKE_NVML_SAMPLES_", device))) {
    if (sample.first > since) newer.push_back(sample);
  }
  if (newer.empty()) return kNotFound;
  *value_type = 1;  // NVML_VALUE_TYPE_UNSIGNED_INT
  if (samples == nullptr) {
    *count = static_cast<unsigned int>(newer.size());
    return kSuccess;
  }
  if (*count < newer.size()) return kInsufficientSize;
  *count = static_cast<unsigned int>(newer.size());
  for (size_t i = 0; i < newer.size(); ++i) {
    samples[i].time_stamp = newer[i].first;
    samples[i].value = 0;
    const auto percent = static_cast<unsigned int>(newer[i].second);
    std::memcpy(&samples[i].value, &percent, sizeof percent);
  }
  return kSuccess;
}

}  // extern "C"
