// A stand-in for libnvidia-ml.so.1 with the symbols the trainer uses, so the NVML path is tested on any machine.
// Its devices answer from environment variables the test sets: FAKE_NVML_DEVICES (count, default 2),
// FAKE_NVML_UTIL_<i> (percent), FAKE_NVML_USED_MIB_<i>, FAKE_NVML_INIT (a return code for nvmlInit_v2).
// Device i's UUID is "GPU-fake-<i>".
#include <cstdlib>
#include <cstring>
#include <string>

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
constexpr int kNotFound = 6;

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
  const unsigned int i = static_cast<FakeDevice*>(device)->index;
  memory->total = 24ULL << 30;
  memory->used = env_number("FAKE_NVML_USED_MIB_" + std::to_string(i), 0) << 20;
  memory->free = memory->total - memory->used;
  return kSuccess;
}

}  // extern "C"
