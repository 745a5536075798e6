#include "quota/service/heartbeat_board.h"

#include <iterator>
#include <utility>

namespace yolo8::quota {

void HeartbeatBoard::publish(const Engine& engine, const Changes& changes, bool all, int64_t now_ms) {
  const std::vector<int64_t>& queue = engine.queue_ids();
  std::lock_guard<std::mutex> lock(mutex_);
  auto refresh = [&](const Lease& lease) {
    auto [it, fresh] = board_.try_emplace(lease.id);
    Beat& beat = it->second;
    if (fresh) beat.telemetry = lease.telemetry;
    beat.team = lease.req.team;
    beat.user = lease.req.user;
    beat.state = lease.state;
    beat.deadline_ms = lease.deadline_ms;
    beat.reason = lease.state == LeaseState::kQueued ? engine.waiting_reason(lease.id, now_ms) : lease.reason;
  };
  if (all) {
    board_.clear();
    for (const auto& [id, lease] : engine.leases()) refresh(lease);
  } else {
    for (int64_t id : changes.leases) {
      if (const Lease* lease = engine.find(id)) refresh(*lease);
    }
  }
  for (size_t i = 0; i < queue.size(); ++i) {
    if (auto it = board_.find(queue[i]); it != board_.end()) it->second.position = static_cast<int>(i) + 1;
  }
  if (board_.size() > engine.leases().size()) {  // prune() dropped ended leases
    for (auto it = board_.begin(); it != board_.end();) {
      it = engine.find(it->first) == nullptr ? board_.erase(it) : std::next(it);
    }
  }
}

HeartbeatBoard::Answer HeartbeatBoard::beat(const Caller& caller, int64_t lease_id, const Telemetry& telemetry,
                                            int64_t now_ms, int64_t monotonic_ms, bool store_samples,
                                            HeartbeatResult& result) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = board_.find(lease_id);
  if (it == board_.end()) return Answer::kUnknownLease;
  Beat& beat = it->second;
  if (!may_act(caller, beat.user, beat.team)) return Answer::kForbidden;
  result.found = true;
  result.state = beat.state;
  result.deadline_ms = beat.deadline_ms;
  result.position = beat.position;
  result.reason = beat.reason;
  if (is_terminal(beat.state)) return Answer::kAnswered;
  if (beat.state == LeaseState::kGranted || beat.state == LeaseState::kRevoking) {
    merge_telemetry(beat.telemetry, telemetry);
    if (store_samples) {
      if (samples_.size() >= max_samples_) samples_.erase(samples_.begin());  // the store is far behind
      samples_.push_back(HeartbeatSample{lease_id, now_ms, beat.telemetry});
    }
  }
  if (reports_.size() >= max_samples_) reports_.erase(reports_.begin());  // the engine lock is held for long
  reports_.push_back(HeartbeatSample{lease_id, monotonic_ms, telemetry});
  return Answer::kAnswered;
}

int HeartbeatBoard::position(int64_t lease_id) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = board_.find(lease_id);
  return it == board_.end() ? 0 : it->second.position;
}

std::vector<HeartbeatSample> HeartbeatBoard::take_reports() {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::exchange(reports_, {});
}

std::vector<HeartbeatSample> HeartbeatBoard::take_samples() {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::exchange(samples_, {});
}

void HeartbeatBoard::add_sample(HeartbeatSample sample) {
  std::lock_guard<std::mutex> lock(mutex_);
  samples_.push_back(std::move(sample));
}

void HeartbeatBoard::put_back_samples(std::vector<HeartbeatSample> batch) {
  std::lock_guard<std::mutex> lock(mutex_);
  batch.insert(batch.end(), samples_.begin(), samples_.end());
  if (batch.size() > max_samples_) batch.erase(batch.begin(), batch.end() - static_cast<long>(max_samples_));
  samples_.swap(batch);
}

void HeartbeatBoard::drop_samples() {
  std::lock_guard<std::mutex> lock(mutex_);
  samples_.clear();
}

}  // namespace yolo8::quota
