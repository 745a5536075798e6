#pragma once
// What the heartbeat reports as the lease's utilisation. With a GPU: NVML's own figure for the leased devices,
// loaded at run time with dlopen (no build dependency; a machine without the driver simply has none). Without:
// the share of the last heartbeat interval spent in training steps, marked as such, so a job whose steps stall
// reports 0 after one interval instead of its last figure. A data-parallel job's ranks each sample their own
// device; rank 0's heartbeat reports them combined (RanksUtilisation).

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace yolo8 {

inline constexpr const char* kNvmlLibrary = "libnvidia-ml.so.1";

class Nvml {
 public:
  struct DeviceSample {
    double util = 0;             // 0..1: share of the driver's last sample period with a kernel running
    double memory_used_gib = 0;  // every process's, as nvidia-smi counts it where the driver has the v2 query
    double memory_total_gib = 0;
    std::string memory_basis;  // "v2" (driver-reserved memory left out, as nvidia-smi) or "v1" (counted in)
  };

  // Opens `library` (a name for the loader's search or a path) and initialises NVML; nullptr when the library,
  // one of its symbols or nvmlInit_v2 fails, with the reason in `why`.
  static std::unique_ptr<Nvml> load(const std::string& library = kNvmlLibrary, std::string* why = nullptr);
  ~Nvml();  // nvmlShutdown, dlclose
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  // `device`: an NVML index ("0") or a UUID ("GPU-..."); nullopt when it cannot be read.
  std::optional<DeviceSample> sample(const std::string& device) const;
  // The mean utilisation (0..1) over the driver's samples taken after `since_us` (microseconds of the wall clock);
  // nullopt where the driver keeps none (then sample()'s reading of its last period is what there is).
  struct UtilisationWindow {
    double util = 0;
    unsigned long long last_us = 0;  // the newest sample's time: the next window starts after it
    int samples = 0;
  };
  std::optional<UtilisationWindow> utilisation_since(const std::string& device, unsigned long long since_us) const;
  // GiB that process `pid` uses on `device`, CUDA context included (nvidia-smi's process list); nullopt when the
  // driver does not say, or names other PIDs (a container without the host's PID namespace).
  std::optional<double> process_memory_gib(const std::string& device, unsigned int pid) const;

 private:
  struct Api;
  explicit Nvml(std::unique_ptr<Api> api);
  std::unique_ptr<Api> api_;
};

// The NVML names of the CUDA devices `cuda_ids`. CUDA numbers the devices it sees fastest first (unless
// CUDA_DEVICE_ORDER=PCI_BUS_ID) after CUDA_VISIBLE_DEVICES (`visible`, "" when unset); NVML numbers every device of
// the machine in PCI order. So a device is named by the UUID CUDA reports for it (`cuda_uuid`, "GPU-…"), which NVML
// looks up exactly; only where CUDA says nothing (a CPU-only build) by `visible`'s entry or the number itself.
using CudaUuidLookup = std::function<std::optional<std::string>(int cuda_id)>;
std::vector<std::string> nvml_device_names(const std::vector<int>& cuda_ids, const std::string& visible,
                                           const CudaUuidLookup& cuda_uuid);
// This process's CUDA device `cuda_id`'s UUID as NVML writes it; nullopt without CUDA or that device.
std::optional<std::string> cuda_device_uuid(int cuda_id);

class UtilisationSampler {
 public:
  struct Reading {
    double util = 0;                      // 0..1
    std::string source;                   // "nvml" or "busy_time"
    double device_memory_used_gib = -1;   // NVML: the busiest device's used memory; -1 without NVML
    double process_memory_used_gib = -1;  // NVML: this process's own memory there; -1 when unknown
    double busy_share = 0;                // 0..1: the busy share of the interval, whatever the source
  };

  // `nvml` null or no `devices`: busy time. `start_s`: the clock at which the first interval begins.
  UtilisationSampler(std::unique_ptr<Nvml> nvml, std::vector<std::string> devices, double start_s);

  // `busy_seconds`: the run's cumulative seconds inside training steps; `now_s`: a monotonic clock. NVML's mean
  // over the devices when every device answers (each device's mean over the interval since the last call where the
  // driver keeps samples), else the busy share of the interval since the last call.
  Reading sample(double busy_seconds, double now_s);

 private:
  std::unique_ptr<Nvml> nvml_;
  std::vector<std::string> devices_;
  unsigned int pid_;
  std::vector<unsigned long long> last_seen_us_;  // per device: the newest NVML sample already averaged
  double last_busy_s_ = 0;
  double last_now_s_ = 0;
};

// The clock the sampler and the ranks' combination share.
inline double monotonic_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// A data-parallel job's devices, one per rank, as sampled at the last combination of the ranks' telemetry
// (every few steps, on every rank: TrainingRun::record_step_and_agree_on_stop).
struct RanksUtilisation {
  int ranks = 0;                       // 0: no combination yet
  bool all_nvml = false;               // every rank read its device with NVML
  double util = 0;                     // 0..1, the mean over the ranks' devices
  double device_memory_used_gib = -1;  // the busiest of them; -1 when one had no NVML
  double combined_at_s = -1;           // monotonic_seconds() of the combination

  // From the sums over the ranks of each rank's NVML utilisation (0 without a reading) and of the ranks without
  // one, and the largest used memory (GiB).
  static RanksUtilisation from_sums(int ranks, double util_sum, double ranks_without_nvml, double busiest_gib,
                                    double now_s);
};

// What rank 0's heartbeat reports for a job of several ranks. `own`: rank 0's sampler, read now.
// - A rank without NVML (known from any combination; it will not gain it): the busy share of the interval,
//   which is already the ranks' mean, so every heartbeat of the job has one source.
// - A combination within the last `interval_s`: the ranks' mean (source nvml).
// - None within one interval: `own` alone. The other ranks' figures are older than an interval, and ranks
//   that finish no step combine nothing, so a stalled job's stale figures must not keep the number up; rank
//   0's devices, read now, speak for it (its idle GPU reads 0), and a job whose 10 steps take longer than an
//   interval still reports a live figure.
UtilisationSampler::Reading with_other_ranks(const UtilisationSampler::Reading& own, const RanksUtilisation& ranks,
                                             double now_s, double interval_s);

}  // namespace yolo8
