#pragma once
// What the heartbeat reports as the lease's utilisation. With a GPU: NVML's own figure for the leased devices,
// loaded at run time with dlopen (no build dependency; a machine without the driver simply has none). Without:
// the share of the last heartbeat interval spent in training steps, marked as such, so a job whose steps stall
// reports 0 after one interval instead of its last figure.

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace yolo8 {

inline constexpr const char* kNvmlLibrary = "libnvidia-ml.so.1";

class Nvml {
 public:
  struct DeviceSample {
    double util = 0;  // 0..1: share of the driver's last sample period with a kernel running
    double memory_used_gib = 0;
    double memory_total_gib = 0;
  };

  // Opens `library` (a name for the loader's search or a path) and initialises NVML; nullptr when the library,
  // one of its symbols or nvmlInit_v2 fails, with the reason in `why`.
  static std::unique_ptr<Nvml> load(const std::string& library = kNvmlLibrary, std::string* why = nullptr);
  ~Nvml();  // nvmlShutdown, dlclose
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  // `device`: an NVML index ("0") or a UUID ("GPU-..."); nullopt when it cannot be read.
  std::optional<DeviceSample> sample(const std::string& device) const;

 private:
  struct Api;
  explicit Nvml(std::unique_ptr<Api> api);
  std::unique_ptr<Api> api_;
};

// NVML names devices by physical index or UUID, CUDA by the position in CUDA_VISIBLE_DEVICES (`visible`, "" when
// unset): the NVML names of the CUDA devices `cuda_ids`.
std::vector<std::string> nvml_device_names(const std::vector<int>& cuda_ids, const std::string& visible);

class UtilisationSampler {
 public:
  struct Reading {
    double util = 0;                     // 0..1
    std::string source;                  // "nvml" or "busy_time"
    double device_memory_used_gib = -1;  // NVML: the busiest device's used memory; -1 without NVML
  };

  // `nvml` null or no `devices`: busy time. `start_s`: the clock at which the first interval begins.
  UtilisationSampler(std::unique_ptr<Nvml> nvml, std::vector<std::string> devices, double start_s);

  // `busy_seconds`: the run's cumulative seconds inside training steps; `now_s`: a monotonic clock. NVML's mean
  // over the devices when every device answers, else the busy share of the interval since the last call.
  Reading sample(double busy_seconds, double now_s);

 private:
  std::unique_ptr<Nvml> nvml_;
  std::vector<std::string> devices_;
  double last_busy_s_ = 0;
  double last_now_s_ = 0;
};

}  // namespace yolo8
