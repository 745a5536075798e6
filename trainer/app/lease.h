#pragma once
// The training job's side of the quota service: acquire a lease before the run, heartbeat while it trains,
// turn a revocation or a long outage into a stop request, release with the outcome. No OpenCV, no data.

#include <atomic>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "quota/client/client.h"
#include "trainer/app/settings.h"
#include "trainer/app/utilisation.h"

namespace yolo8 {

// What the heartbeat reports; the training loop writes it, the heartbeat thread reads it.
struct LeaseTelemetry {
  std::atomic<int64_t> step{-1};
  std::atomic<int> epoch{-1};
  std::atomic<double> memory_used_gib{-1.0};
  // Seconds spent inside training steps so far; the heartbeat turns it into the busy share of its own interval
  // when there is no NVML (a job whose steps stall reports 0 after one interval, not its last figure).
  std::atomic<double> busy_seconds{0.0};
  std::atomic<int64_t> last_checkpoint_ms{0};
  std::atomic<int> batch{-1};  // images per GPU, once sized: with the peak, what quotad learns memory from

  // Data parallel: every rank's device, as the ranks last combined them (rank 0's heartbeat reports them).
  void set_ranks(const RanksUtilisation& ranks) {
    std::lock_guard<std::mutex> lock(ranks_mutex_);
    ranks_ = ranks;
  }
  RanksUtilisation ranks() const {
    std::lock_guard<std::mutex> lock(ranks_mutex_);
    return ranks_;
  }

 private:
  mutable std::mutex ranks_mutex_;
  RanksUtilisation ranks_;
};

// GPU UUIDs a device plugin made visible: NVIDIA_VISIBLE_DEVICES (else CUDA_VISIBLE_DEVICES) when it lists
// UUIDs (GPU-..., MIG-...); empty otherwise. Reported to quotad with the lease request.
std::vector<std::string> visible_gpu_uuids();

// Why device= (`device_ids`: the GPUs the run uses, given or picked) contradicts the lease's GPUs
// (`lease_devices`, "node:index"); "" when it does not.
// `node`: the trainer's node ("local" in local mode, $NODE_NAME, or "" when unknown). With `remapped` (a device
// plugin chose the GPUs, so the container numbers them 0..n-1) only the count can be checked.
std::string device_conflict(const std::vector<std::string>& lease_devices, const std::vector<int>& device_ids,
                            const std::string& node, bool remapped);

// A stop was requested while the lease request was still queued.
class StoppedWhileWaiting : public std::runtime_error {
 public:
  StoppedWhileWaiting() : std::runtime_error("stopped while waiting for a GPU lease") {}
};

class TrainingLease {
 public:
  // Acquires (blocking while queued, printing the position) unless quota=off or the run has no GPU and quota
  // is local. Throws quota::QuotaRefused when the service says no. `gpu_memory_gib`: the local GPUs' memory,
  // the inventory of the local quota's policy (0: unknown).
  // `device_name` ("NVIDIA H200", "cpu") goes with the memory peaks the heartbeats report.
  TrainingLease(const Settings& settings, const std::string& job_name, bool uses_gpu, int gpus,
                double gpu_memory_gib = 0, const std::string& device_name = "");
  // Releases as failed unless release() was called: a crash must not hold GPUs until the TTL.
  ~TrainingLease();
  TrainingLease(const TrainingLease&) = delete;
  TrainingLease& operator=(const TrainingLease&) = delete;

  bool active() const { return client_ != nullptr; }
  double memory_gib() const;  // per GPU, what the run may use: its GPU's memory, or its share; 0 without a lease
  int64_t id() const;
  LeaseTelemetry& telemetry() { return telemetry_; }

  // Requests a stop (StopReason) when the lease was revoked, lost, or the service is unreachable too long.
  void check();
  void release(quota::Outcome outcome);

 private:
  std::unique_ptr<quota::QuotaClient> client_;
  LeaseTelemetry telemetry_;
  bool released_ = false;
};

}  // namespace yolo8
