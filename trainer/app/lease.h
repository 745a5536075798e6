#pragma once
// The training job's side of the quota service: acquire a lease before the run, heartbeat while it trains,
// turn a revocation or a long outage into a stop request, release with the outcome. No OpenCV, no data.

#include <atomic>
#include <memory>
#include <stdexcept>
#include <string>

#include "quota/client/client.h"
#include "trainer/app/settings.h"

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
};

// A stop was requested while the lease request was still queued.
class StoppedWhileWaiting : public std::runtime_error {
 public:
  StoppedWhileWaiting() : std::runtime_error("stopped while waiting for a GPU lease") {}
};

class TrainingLease {
 public:
  // Acquires (blocking while queued, printing the position) unless quota=off or the run has no GPU and quota
  // is local. Throws quota::QuotaRefused when the service says no.
  TrainingLease(const Settings& settings, const std::string& job_name, bool uses_gpu, int gpus);
  // Releases as failed unless release() was called: a crash must not hold GPUs until the TTL.
  ~TrainingLease();
  TrainingLease(const TrainingLease&) = delete;
  TrainingLease& operator=(const TrainingLease&) = delete;

  bool active() const { return client_ != nullptr; }
  double memory_gib() const;  // per GPU; 0 without a lease
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
