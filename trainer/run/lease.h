#pragma once
// The training job's side of the quota service: acquire a lease before the run, heartbeat while it trains,
// turn a revocation or a long outage into a stop request, release with the outcome. No OpenCV, no data.

#include <atomic>
#include <filesystem>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "quota/client/client.h"
#include "trainer/cli/settings.h"
#include "trainer/runtime/utilisation.h"

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

// The CUDA ordinals a run must use for its lease's GPUs (`lease_devices`, "node:index"), and the line that
// says so ("Using GPU 2 (leased node-a:2)"). `ordinals`: device= as given when it agrees with the lease, else
// (device= empty) the first leased GPU, one process using one GPU; empty when the lease names no device.
struct DeviceBinding {
  std::vector<int> ordinals;
  std::string summary;
};

// Turns the lease's GPUs into this process's CUDA ordinals. `node`: the trainer's node ($NODE_NAME, "local" in
// local mode, "" when unknown: every leased GPU counts); only the GPUs leased on it are this process's.
// `device_ids`: device= as given (empty: use the leased GPUs). `cuda_visible_devices`: $CUDA_VISIBLE_DEVICES
// ("" when unset); a list of indices renumbers the GPUs, so leased GPU p is the ordinal of p's position in it.
// `remapped`: a device plugin chose the GPUs (UUIDs visible), so the container numbers them 0..n-1. The local
// quota numbers its inventory by CUDA ordinal already: pass "" and false there.
// Throws SettingsError naming `device` (exit 2) with the fix when device= contradicts the lease, the lease is
// on another node, or a leased GPU is not visible.
DeviceBinding bind_leased_devices(const std::vector<std::string>& lease_devices, const std::string& node,
                                  const std::vector<int>& device_ids, const std::string& cuda_visible_devices,
                                  bool remapped);

// The node's GPU numbers of device= (CUDA ordinals), which the request asks for by number: CUDA_VISIBLE_DEVICES
// as indices renumbers them (ordinal 1 of "4,6" is GPU 6). Empty when it lists UUIDs (a device plugin chose the
// GPUs, matched by UUID) or an ordinal is past its end (bind_leased_devices then says so).
std::vector<int> node_gpu_indices(const std::vector<int>& device_ids, const std::string& cuda_visible_devices);

// This machine's GPUs, the local quota's inventory: local:i is CUDA ordinal i. `memory_gib`: the smallest one's
// memory (0: unknown).
struct LocalGpus {
  int count = 0;
  double memory_gib = 0;
};

// A stop was requested while the lease request was still queued, or waited for an unavailable quotad.
class StoppedWhileWaiting : public std::runtime_error {
 public:
  StoppedWhileWaiting() : std::runtime_error("stopped while waiting for a GPU lease") {}
};

// The run folder's record of a lease whose release quotad never acknowledged (quotad unavailable as the run
// ended): the next run of the job there (a resume, a restarted pod) releases it before asking for its own.
inline constexpr char kUnreleasedLeaseFile[] = "quota_lease.json";

class TrainingLease {
 public:
  // Acquires (blocking while queued, printing the position) unless quota=off or the run has no GPU and quota
  // is local. An unavailable quotad is retried for quota_retry_s, each wait announced with its countdown, then
  // quota::QuotaUnavailable. Throws quota::QuotaRefused when the service says no, SettingsError when device=
  // contradicts the granted GPUs (bind_leased_devices), StoppedWhileWaiting on a stop request while it waits.
  // `local_gpus`: the local quota's inventory (a GPU run; a CPU run that asks for a share holds one slot).
  // `device_name` ("NVIDIA H200", "cpu") goes with the memory peaks the heartbeats report.
  // `unreleased_file`: the run folder's kUnreleasedLeaseFile when known ("": none yet). A lease it records, asked
  // of this quota setting, is released first (its outcome sent again), the file removed once quotad answered.
  TrainingLease(const Settings& settings, const std::string& job_name, bool uses_gpu, int gpus,
                LocalGpus local_gpus = {}, const std::string& device_name = "",
                const std::filesystem::path& unreleased_file = {});
  // Releases as failed unless release() was called: a crash must not hold GPUs until the TTL.
  ~TrainingLease();
  TrainingLease(const TrainingLease&) = delete;
  TrainingLease& operator=(const TrainingLease&) = delete;

  bool active() const { return client_ != nullptr; }
  double memory_gib() const;  // per GPU, what the run may use: its GPU's memory, or its share; 0 without a lease
  int64_t id() const;
  // The leased GPUs as this process's CUDA ordinals (empty without a GPU lease): where a run with device= empty
  // goes.
  const DeviceBinding& devices() const { return devices_; }
  LeaseTelemetry& telemetry() { return telemetry_; }

  // Requests a stop (StopReason) when the lease was revoked, lost, or the service is unreachable too long. Reads
  // what the heartbeat thread found: never waits on the network.
  void check();
  // Gives the lease back and says how it went: "Lease N released" only when quotad acknowledged it, else when
  // quotad expires it. Bounded by the client's short timeouts (quota::QuotaClient::release).
  // A release quotad does not acknowledge is recorded in `unreleased_file` (written atomically), for the next run.
  void release(quota::Outcome outcome);
  // Where to record an unacknowledged release from now on (the run folder, once it is known).
  void remember_unreleased_in(const std::filesystem::path& unreleased_file) { unreleased_file_ = unreleased_file; }

 private:
  void release_earlier_lease();
  // Records the lease after a release quotad did not acknowledge; true when written.
  bool remember_unreleased(quota::Outcome outcome);

  std::string quota_;  // the quota setting the lease was asked of
  std::filesystem::path unreleased_file_;
  std::unique_ptr<quota::QuotaClient> client_;
  LeaseTelemetry telemetry_;
  DeviceBinding devices_;
  bool released_ = false;
};

}  // namespace yolo8
