#include "quota/service/engine_host.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <utility>

namespace yolo8::quota {

namespace {

int64_t steady_now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Which monotonic clock a local-mode process reads: steady_clock is CLOCK_MONOTONIC, one clock for every process
// of the machine until it reboots (then it starts afresh: the boot id tells); an injected clock is its own.
std::string monotonic_clock_id(bool injected) {
  if (injected) return "injected";
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  return "boot:" + id;
}
constexpr const char* kClockReferenceKey = "local_clock_reference";

// The waste tracker the policy's thresholds make, with nothing observed yet.
UtilTracker fresh_tracker(const Policy& policy) {
  return UtilTracker(policy.waste_gpu_util_below, static_cast<int64_t>(policy.waste_after_s) * 1000);
}

EngineMode mode_of(const ServiceOptions& options, bool has_store, bool replicated) {
  if (!has_store) return EngineMode::kMemory;
  if (replicated) return EngineMode::kFollower;  // until it takes the lead
  return options.reload_per_call ? EngineMode::kLocal : EngineMode::kSingle;
}

}  // namespace

const char* to_string(EngineMode mode) {
  switch (mode) {
    case EngineMode::kMemory: return "memory";
    case EngineMode::kSingle: return "single";
    case EngineMode::kLocal: return "local";
    case EngineMode::kLeader: return "leader";
    case EngineMode::kFollower: return "follower";
  }
  return "?";
}

bool serves_state(EngineMode mode) {
  switch (mode) {
    case EngineMode::kMemory:
    case EngineMode::kSingle:
    case EngineMode::kLocal:
    case EngineMode::kLeader: return true;
    case EngineMode::kFollower: return false;
  }
  return false;
}

EngineHost::EngineHost(Policy policy, const ServiceOptions& options, std::unique_ptr<StateStore> store,
                       HeartbeatBoard& board, std::unique_ptr<PostgresLeadership> leadership)
    : options_(options),
      mode_(mode_of(options, store != nullptr, leadership != nullptr)),
      leadership_(std::move(leadership)),
      board_(board),
      engine_(std::move(policy)),
      tracker_(fresh_tracker(engine_.policy())),
      store_(std::move(store)) {
  clock_ = options_.clock ? options_.clock : system_now_ms;
  monotonic_ = options_.monotonic_clock ? options_.monotonic_clock : options_.clock ? options_.clock : steady_now_ms;
  // After a restart the monotonic clock starts afresh: the stored leases' wall times are taken as they are
  // (restore() gives running leases a fresh heartbeat clock); only a step back shows, in start_from_store().
  clock_offset_ms_ = clock_() - monotonic_();
  local_clock_id_ = monotonic_clock_id(options_.monotonic_clock || options_.clock);
  receipt_key_ = store_ ? store_->receipt_key() : key_from_hex(new_receipt_key_hex());
  if (mode_ == EngineMode::kSingle) start_from_store();
  last_tick_ms_ = monotonic_();
  board_.publish(engine_, Changes{}, true, clock_());
  if (leadership_) {
    std::lock_guard<std::mutex> lock(mutex_);
    try_to_lead_locked();
  }
}

std::string EngineHost::follower_refusal() const {
  const std::string leader = this->leader();
  return "follower: this quotad replica does not lead; " +
         (leader.empty() ? std::string("no leader is known yet, retry shortly") : "the leader is " + leader);
}

std::string EngineHost::leader() const {
  std::lock_guard<std::mutex> lock(leader_mutex_);
  return leader_;
}

void EngineHost::set_leader(std::string address) {
  std::lock_guard<std::mutex> lock(leader_mutex_);
  leader_ = std::move(address);
}

void EngineHost::try_to_lead_locked() {
  const int64_t started = monotonic_();
  if (!leadership_->try_lead(clock_())) {
    set_leader(leadership_->leader_address());
    return;
  }
  try {
    store_->fence(leadership_->epoch());
    tracker_ = fresh_tracker(engine_.policy());
    start_from_store();
  } catch (const std::exception& error) {
    // the state could not be loaded: leave the lead to a replica that can
    std::fprintf(stderr, "quotad: took the lead (epoch %lld) but could not load the state: %s\n",
                 static_cast<long long>(leadership_->epoch()), error.what());
    leadership_->resign();
    return;
  }
  const int64_t now = clock_();
  engine_.note(now, "quotad", "replica.lead",
               "this replica (" + options_.replica_address + ") leads in epoch " +
                   std::to_string(leadership_->epoch()) + "; the state loaded in " +
                   std::to_string(monotonic_() - started) + " ms");
  store_->write(engine_, engine_.take_changes());
  last_tick_ms_ = monotonic_();
  mode_ = EngineMode::kLeader;
  set_leader(options_.replica_address);
  board_.publish(engine_, Changes{}, true, now);
  std::fprintf(stderr, "quotad: this replica leads (epoch %lld)\n", static_cast<long long>(leadership_->epoch()));
}

void EngineHost::step_down_locked(const std::string& why) {
  if (mode_ != EngineMode::kLeader) return;
  // the successor is named before the mode changes: a refusal or /readyz answered meanwhile must not name this
  // replica, whose address leader_ still holds, as the leader
  set_leader(leadership_->leader_address());  // the replica that took over, if one has
  mode_ = EngineMode::kFollower;
  std::fprintf(stderr, "quotad: this replica no longer leads (%s): it follows\n", why.c_str());
}

void EngineHost::load_whole_state(int64_t now_ms, bool restart) {
  // kLocal keeps only what a call may touch: live leases and those ended within a ttl and an hour, no audit
  const Policy& policy = engine_.policy();
  Snapshot snapshot =
      restart
          ? store_->load(now_ms, options_.keep_ended_ms, 10000)
          : store_->load(now_ms, static_cast<int64_t>(policy.ttl_s + policy.expiry_grace_s) * 1000 + 3600 * 1000, 0);
  engine_.restore(std::move(snapshot.leases), std::move(snapshot.approvals), std::move(snapshot.audit),
                  std::move(snapshot.usage), snapshot.next_audit_seq, restart ? now_ms : 0);
  engine_.reserve_ids(snapshot.next_lease_id, snapshot.next_approval_id);
  engine_.restore_ledger(std::move(snapshot.loans), std::move(snapshot.grants), snapshot.next_loan_id,
                         snapshot.next_grant_id);
}

void EngineHost::start_from_store() {
  const int64_t now = clock_();
  load_whole_state(now, true);
  // A wall clock set back while quotad was down (or a replica's clock behind its predecessor's) leaves live leases
  // seen "in the future": the step was at least that, and their clocks move back by it (else a dead job would keep
  // its GPUs until then). Followed before the check below, which judges the state at this clock's now.
  int64_t latest = now;
  for (const auto& [id, lease] : engine_.leases()) {
    if (!is_terminal(lease.state)) latest = std::max(latest, lease.last_seen_ms);
  }
  const bool set_back = latest - now > options_.clock_step_after_ms;
  if (set_back) {
    std::fprintf(stderr, "quotad: stored leases were seen %lld ms after the wall clock's now: it was set back\n",
                 static_cast<long long>(latest - now));
    engine_.clock_stepped(now - latest, now);
  }
  // what restore() found against the inventory (leases ended, remapped or quarantined) is audited and stored
  // before anything is served. What check_invariants still finds comes from a policy edit the held leases
  // predate (a bigger pool, a lower max_leases_per_gpu): new grants respect the policy and the held leases
  // end in time, so it is audited rather than keeping quotad down.
  for (const std::string& error : engine_.check_invariants(now)) {
    engine_.note(now, "quotad", "state.unsound", "at load: " + error);
  }
  store_->write(engine_, engine_.take_changes());
  store_->replay_heartbeats(engine_, tracker_);  // the waste list survives a restart
  if (set_back) tracker_.clock_stepped(now - latest, now);
}

void EngineHost::follow_clock_locked() {
  const int64_t wall = clock_();
  const int64_t offset = wall - monotonic_();
  const int64_t step = offset - std::exchange(clock_offset_ms_, offset);
  if (std::abs(step) <= options_.clock_step_after_ms) return;  // drift and slewing are followed silently
  std::fprintf(stderr, "quotad: the wall clock stepped by %lld ms against the monotonic clock\n",
               static_cast<long long>(step));
  engine_.clock_stepped(step, wall);
  tracker_.clock_stepped(step, wall);
}

void EngineHost::follow_shared_clock_locked(int64_t now_ms) {
  // Local mode's processes share one monotonic clock and the database: the offset of the wall clock against it
  // is kept in meta, so a step is seen by whichever process calls first, and applied to the stored leases once.
  const int64_t offset = now_ms - monotonic_();
  std::istringstream stored(store_->meta(kClockReferenceKey));
  std::string stored_id;
  int64_t stored_offset = 0;
  if (stored >> stored_id >> stored_offset && stored_id == local_clock_id_) {
    const int64_t step = offset - stored_offset;
    if (std::abs(step) > options_.clock_step_after_ms) {
      std::fprintf(stderr, "quota: the wall clock stepped by %lld ms against the monotonic clock\n",
                   static_cast<long long>(step));
      engine_.clock_stepped(step, now_ms);
    }
  }
  store_->set_meta(kClockReferenceKey, local_clock_id_ + " " + std::to_string(offset));
}

void EngineHost::count_committed(const Changes& changes) {
  for (const auto& entry : changes.audit) {
    if (entry.action == "preempt.revoke") ++preemptions_total_;
    if (entry.action == "emergency.granted") ++emergency_total_;
  }
}

void EngineHost::merge_reports_locked() {
  for (const auto& report : board_.take_reports()) {
    // received at a monotonic time: in the engine's frame, the wall time as of the last clock check (a step since
    // is followed after the merge, moving these with the rest)
    const int64_t seen_ms = report.ts_ms + clock_offset_ms_;
    engine_.touch(report.lease_id, report.telemetry, seen_ms);
    const Lease* lease = engine_.find(report.lease_id);
    if (lease != nullptr && (lease->state == LeaseState::kGranted || lease->state == LeaseState::kRevoking)) {
      tracker_.observe(report.lease_id, seen_ms, report.telemetry.gpu_util);
    }
  }
}

ApiResponse EngineHost::run_local(const std::function<ApiResponse()>& op) {
  std::unique_lock<std::mutex> lock(mutex_);
  std::lock_guard<std::mutex> store_lock(store_mutex_);
  store_->begin_immediate();
  try {
    const int64_t now = clock_();
    load_whole_state(now, false);
    follow_shared_clock_locked(now);  // before the tick: a step forward must not expire every lease
    engine_.tick(now);
    ApiResponse response = op();
    Changes changes = engine_.take_changes();
    store_->write(engine_, changes);
    store_->write_heartbeats(board_.take_samples());
    store_->commit();
    count_committed(changes);
    return response;
  } catch (...) {
    board_.drop_samples();
    store_->rollback();
    throw;
  }
}

bool EngineHost::lease_recorded(int64_t lease_id) {
  if (!store_) return false;
  if (mode_ == EngineMode::kLocal) return store_->lease_recorded(lease_id);  // run_local holds the store lock
  std::lock_guard<std::mutex> store_lock(store_mutex_);
  return store_->lease_recorded(lease_id);
}

void EngineHost::credit_outage_locked() {
  if (options_.outage_after_ms <= 0) return;
  const int64_t now_monotonic = monotonic_();
  const int64_t gap = now_monotonic - last_tick_ms_.load();
  if (gap <= options_.outage_after_ms) return;
  // in the engine's frame as of the last clock check, as the reports merged next are: a step since is followed
  // after them and moves the credited clocks with the rest
  const int64_t now = now_monotonic + clock_offset_ms_;
  engine_.credit_outage(now - gap, now);
  last_tick_ms_ = now_monotonic;
}

void EngineHost::note_write_failed() {
  ++storage_write_errors_;
  store_down_until_ = (std::chrono::steady_clock::now() + std::chrono::milliseconds(options_.store_backoff_ms))
                          .time_since_epoch()
                          .count();
}

ApiResponse EngineHost::run(const std::function<ApiResponse()>& op, bool writes) {
  if (mode_ == EngineMode::kLocal) return run_local(op);
  if (mode_ == EngineMode::kFollower) throw Unavailable(follower_refusal());
  // After a failed write, changes fail fast for a moment instead of queueing behind the stalled store (each
  // would hold the engine lock for the whole busy timeout in turn).
  auto store_down = [&] {
    return writes && store_ && std::chrono::steady_clock::now().time_since_epoch().count() < store_down_until_.load();
  };
  if (store_down()) throw Unavailable("storage: unavailable (the last write failed just now); retry shortly");
  std::unique_lock<std::mutex> lock(mutex_);
  if (mode_ == EngineMode::kFollower) throw Unavailable(follower_refusal());  // stepped down meanwhile
  if (store_down()) throw Unavailable("storage: unavailable (the last write failed just now); retry shortly");
  // before the snapshot and the reports: the outage and a step are facts, kept (and stored with the next write)
  // even if this change fails
  credit_outage_locked();
  merge_reports_locked();
  if (writes) follow_clock_locked();
  // Persist, then apply: the engine's state is kept as it was until the change is durable. A read copies
  // nothing; should it change state after all, the change is still written before the answer.
  std::optional<EngineState> before;
  if (writes && store_) before.emplace(engine_.snapshot());
  ApiResponse response = op();
  Changes changes = engine_.take_changes();
  if (!changes.empty() && store_) {
    try {
      std::lock_guard<std::mutex> store_lock(store_mutex_);
      store_->write(engine_, changes);
    } catch (const StoreError& error) {
      note_write_failed();
      // a read changes nothing, so cannot get here; never answer success on lost state
      if (!before) throw;
      engine_.load(std::move(*before));
      if (leadership_ && !leadership_->leads()) step_down_locked(error.what());
      throw Unavailable(std::string("storage: the change was not saved and not applied: ") + error.what());
    }
  }
  count_committed(changes);
  if (!changes.empty()) board_.publish(engine_, changes, false, clock_());
  return response;
}

void EngineHost::tick(const std::map<std::string, int>& auth_attempts) {
  if (mode_ == EngineMode::kLocal) {
    run_local([] { return ApiResponse{}; });
    return;
  }
  if (leadership_) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (mode_ == EngineMode::kLeader && !leadership_->leads()) step_down_locked("its database session ended");
    if (mode_ == EngineMode::kFollower) try_to_lead_locked();
    if (mode_ == EngineMode::kFollower) return;
  }
  int64_t now_monotonic = 0;
  run(
      [&] {
        const int64_t now = clock_();
        now_monotonic = monotonic_();
        // failed authentications, one entry per address and tick rather than one per guess
        for (const auto& [address, count] : auth_attempts) {
          engine_.note(now, "quotad", "auth.failed",
                       std::to_string(count) + " failed or refused authentication(s) from " +
                           (address.empty() ? "(in process)" : address));
        }
        engine_.tick(now);  // run() credited an outage first
        engine_.prune(now, options_.keep_ended_ms);
        sync_tracker(engine_, tracker_);  // ended runs closed, pruned leases dropped, even without scrapes
        return ApiResponse{};
      },
      true);
  // only a tick that was saved moves the clock: a stalled store is quotad's outage too
  last_tick_ms_ = now_monotonic;
}

void EngineHost::flush_heartbeats() {
  std::vector<HeartbeatSample> batch = board_.take_samples();
  if (!store_) return;
  if (!batch.empty()) {
    try {
      std::lock_guard<std::mutex> store_lock(store_mutex_);
      store_->write_heartbeats(batch);
    } catch (const StoreError&) {
      ++storage_write_errors_;
      board_.put_back_samples(std::move(batch));  // for the next round (bounded: the oldest go first)
      throw;
    }
  }
  fold_old_heartbeats();
}

void EngineHost::fold_old_heartbeats() {
  const EngineMode mode = mode_.load();
  if (options_.heartbeat_retention_ms <= 0 || (mode != EngineMode::kSingle && mode != EngineMode::kLeader)) return;
  const int64_t now = clock_();
  if (now < next_fold_ms_) return;
  next_fold_ms_ = now + kFoldEveryMs;  // also after a failure: the next try is a while away
  double threshold = 0;
  int64_t waste_after_ms = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    threshold = tracker_.threshold();
    waste_after_ms = tracker_.waste_after_ms();
  }
  std::lock_guard<std::mutex> store_lock(store_mutex_);
  // more may be due: the next round goes on
  if (store_->fold_heartbeats(now - kSummariseAfterMs, now - options_.heartbeat_retention_ms, threshold, waste_after_ms,
                              kFoldBatchRows) > 0) {
    next_fold_ms_ = now;
  }
}

std::vector<AuditEntry> EngineHost::audit(int64_t after, size_t limit, const std::string& team) {
  std::vector<AuditEntry> entries;
  if (store_) {
    // every change is written before it is answered, so the table is complete
    std::lock_guard<std::mutex> store_lock(store_mutex_);
    return store_->audit(after, limit, team);
  }
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& entry : engine_.audit()) {
    if (entry.seq > after && (team.empty() || entry.team == team) && entries.size() < limit) entries.push_back(entry);
  }
  return entries;
}

void EngineHost::copy_for_view(std::optional<Engine>& engine, std::optional<UtilTracker>& tracker,
                               std::string& audit_head) {
  std::lock_guard<std::mutex> lock(mutex_);
  merge_reports_locked();
  sync_tracker(engine_, tracker_);
  engine.emplace(engine_);
  tracker.emplace(tracker_);
  if (store_) audit_head = store_->audit_head();
}

}  // namespace yolo8::quota
