#pragma once
// The heartbeat board: what a heartbeat needs to know about each lease, published after every committed change,
// so that heartbeats are answered without the engine lock (which a state change holds while it waits for the
// store); and the reports so answered, on their way to the engine and to the store.
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "quota/core/engine.h"
#include "quota/service/auth_gate.h"
#include "quota/store/store.h"

namespace yolo8::quota {

class HeartbeatBoard {
 public:
  // `max_samples`: reports buffered for the engine, and samples for the store, at most (the oldest dropped).
  explicit HeartbeatBoard(size_t max_samples) : max_samples_(max_samples) {}

  // After a committed change, under the engine lock: the `changes`' leases (every lease when `all`), every
  // queued position; leases prune() dropped leave the board.
  void publish(const Engine& engine, const Changes& changes, bool all, int64_t now_ms);

  enum class Answer { kAnswered, kUnknownLease, kForbidden };
  // A heartbeat of `caller` for `lease_id` answered from the board into `result`. A live lease's report is kept
  // for the engine (received at `monotonic_ms`); a running lease's figures also for the store when
  // `store_samples`.
  Answer beat(const Caller& caller, int64_t lease_id, const Telemetry& telemetry, int64_t now_ms, int64_t monotonic_ms,
              bool store_samples, HeartbeatResult& result);
  // The queue position the board shows for a lease; 0 when it shows none.
  int position(int64_t lease_id) const;

  // The reports answered since the last call, for the engine and the tracker (ts_ms on the monotonic clock).
  std::vector<HeartbeatSample> take_reports();
  // The samples for the store since the last call, and back when the store could not take them (in front of the
  // newer ones; the oldest dropped beyond the bound).
  std::vector<HeartbeatSample> take_samples();
  void add_sample(HeartbeatSample sample);
  void put_back_samples(std::vector<HeartbeatSample> batch);
  void drop_samples();

 private:
  struct Beat {
    std::string team, user;
    LeaseState state = LeaseState::kQueued;
    int64_t deadline_ms = 0;
    int position = 0;
    std::string reason;
    Telemetry telemetry;  // the latest figures, each carried forward until reported again
  };

  const size_t max_samples_;
  // Guards the board and both buffers; never held during I/O, and nothing is waited for while it is held (the
  // engine lock, when both are held, is taken first).
  mutable std::mutex mutex_;
  std::map<int64_t, Beat> board_;
  std::vector<HeartbeatSample> samples_;  // for the store (batched)
  // Raw reports for the engine and the tracker, ts_ms on the monotonic clock (a wall step between a report and
  // its merge must not move it twice, or not at all).
  std::vector<HeartbeatSample> reports_;
};

}  // namespace yolo8::quota
