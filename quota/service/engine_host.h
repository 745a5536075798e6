#pragma once
// The engine host: the Engine with its store, its transactions (a change is written before it is answered, and
// undone when it cannot be), and the clock follower (steps of the wall clock, quotad's own outages).
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "quota/core/api.h"
#include "quota/core/engine.h"
#include "quota/core/usage.h"
#include "quota/service/heartbeat_board.h"
#include "quota/store/postgres_leadership.h"
#include "quota/store/state_store.h"

namespace yolo8::quota {

struct ServiceOptions {
  std::string db_path;           // --db: a SQLite file or a PostgreSQL URL (parse_db_target); empty: in memory only
  std::string db_password_file;  // PostgreSQL: the password's file (empty: libpq's PGPASSWORD / PGPASSFILE)
  // PostgreSQL: where this replica serves, as trainers name it (a follower's 503 names the leader's)
  std::string replica_address;
  bool reload_per_call = false;    // local mode: several processes share db_path; each call locks and reloads it
  bool full_sync = false;          // SQLite synchronous=FULL instead of NORMAL
  std::function<int64_t()> clock;  // UTC ms; the system clock when empty
  // Milliseconds of a clock that never steps: expiry, billing and quotad's own outages go by its differences;
  // wall time stays what is shown and stored. When empty: steady_clock with the system clock, `clock` itself when
  // that is set (a scripted time has no steps to follow).
  std::function<int64_t()> monotonic_clock;
  // The wall clock moving by more than this against the monotonic one between two checks is a step (NTP, a
  // hand-set date), not drift: the engine's lease clocks move with it (Engine::clock_stepped), audited and logged.
  int64_t clock_step_after_ms = 30000;
  int64_t keep_ended_ms = 24 * 3600 * 1000LL;  // ended leases kept in memory for GET
  bool write_each_heartbeat = false;           // commit every heartbeat sample at once instead of batching (benchmarks)
  // How long a state change waits for the SQLite write lock (another process holding it) before it is answered
  // 503 with Retry-After, its effects undone; after such a failure, state changes are answered 503 at once for
  // store_backoff_ms rather than each waiting in turn. Local mode waits longer: the other holders are
  // trainers on the same workstation.
  int store_busy_timeout_ms = 30000;
  int store_backoff_ms = 1000;
  // A gap longer than this between two ticks is quotad's own outage (stalled, stopped): lease clocks are
  // extended by it (Engine::credit_outage). 0 = off; the server ticks every second and sets 3000.
  int64_t outage_after_ms = 0;
  size_t max_pending_heartbeats = 200000;  // samples buffered while the store is unavailable (oldest dropped)
  // Bounded history: each hour's heartbeats are summed up per lease once it is over (StateStore::fold_heartbeats),
  // so that a restart and the reports read summaries; raw rows are kept this long (quotad serve
  // --heartbeat-retention-days), then deleted. A bounded step per heartbeat flush while any is due, then every
  // kFoldEveryMs. 0: neither (raw rows kept for ever). Not in local mode, nor by a follower.
  int64_t heartbeat_retention_ms = 0;
};

// Rows summed up or deleted in one transaction: a short hold of the store (writes queue behind it meanwhile).
inline constexpr int64_t kFoldBatchRows = 20000;
inline constexpr int64_t kFoldEveryMs = 10 * 60 * 1000;
// An hour is summed up this long after it ended: the heartbeats the board still buffered (a flush every second,
// longer while the store is unavailable) are stored by then.
inline constexpr int64_t kSummariseAfterMs = 10 * 60 * 1000;

// How this process's engine relates to the store.
enum class EngineMode {
  kMemory,  // no store: the state lives and dies with the process
  kSingle,  // this process owns the store: the state is loaded once, kept in memory and every change written
  kLocal,   // processes share the store (local mode): each call locks it, reloads the whole state, writes, commits
  // Replicas sharing a PostgreSQL database (PostgresLeadership): the leader is kSingle with its writes fenced by
  // its epoch; a follower holds no state, answers every call 503 naming the leader, and tries to take the lead at
  // every tick (then it loads the whole state, as a start does).
  kLeader,
  kFollower,
};
const char* to_string(EngineMode mode);
// Whether a process in `mode` answers from the state it holds (GET /readyz): a follower will not, so that no
// traffic reaches it; a mode added here decides its readiness here.
bool serves_state(EngineMode mode);

// The store could not take a write in time (another process holds its lock, a slow disk): nothing changed.
class Unavailable : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class EngineHost {
 public:
  // `store` null: state in memory only. Loads the stored state (kSingle), checked, with the heartbeats' history.
  // With `leadership` (replicas on PostgreSQL) it starts as a follower and takes the lead at once when it is free.
  EngineHost(Policy policy, const ServiceOptions& options, std::unique_ptr<StateStore> store, HeartbeatBoard& board,
             std::unique_ptr<PostgresLeadership> leadership = nullptr);

  EngineMode mode() const { return mode_.load(); }
  // The leader's address a follower names in its refusals, as the leader recorded it; "" while unknown.
  std::string leader() const;
  // What a follower answers every call with (503): that it does not lead, and who does when known.
  std::string follower_refusal() const;
  bool has_store() const { return store_ != nullptr; }
  int64_t now() const { return clock_(); }
  int64_t monotonic_now() const { return monotonic_(); }

  // Runs `op` under the engine lock, the heartbeats answered from the board merged first. When it changed state,
  // the change is written before the answer leaves; a failed write loads the state from before (Unavailable, to
  // be answered 503). `writes` false: a read (it copies nothing; should it change state, the change is still
  // written). In kLocal the whole call is one store transaction over a freshly loaded state.
  ApiResponse run(const std::function<ApiResponse()>& op, bool writes);
  // The key grant receipts are signed and checked with: the store's (StateStore::receipt_key), or one made at
  // random for a state in memory only.
  const std::string& receipt_key() const { return receipt_key_; }
  // Whether the store holds a lease row with this id (StateStore::lease_recorded); false without a store. For
  // `op` of run() only (kLocal: inside its transaction).
  bool lease_recorded(int64_t lease_id);
  // The engine and the tracker, for `op` of run() only.
  Engine& engine() { return engine_; }
  UtilTracker& tracker() { return tracker_; }

  // The periodic tick: failed authentications audited, an outage credited, expiry, deadlines, the queue, pruning.
  void tick(const std::map<std::string, int>& auth_attempts);
  // Writes the heartbeat samples the board buffered, in one transaction; kept for the next round on failure. Then
  // folds a batch of heartbeats older than the retention period when one is due (ServiceOptions).
  void flush_heartbeats();
  // The audit log from the store (complete: every change is written before it is answered), else from memory.
  std::vector<AuditEntry> audit(int64_t after, size_t limit, const std::string& team);
  // Copies of the engine and the tracker (brought up to date) and the audit chain's head, for read-only pages.
  void copy_for_view(std::optional<Engine>& engine, std::optional<UtilTracker>& tracker, std::string& audit_head);

  uint64_t preemptions() const { return preemptions_total_.load(); }
  uint64_t emergency_grants() const { return emergency_total_.load(); }
  uint64_t storage_write_errors() const { return storage_write_errors_.load(); }

 private:
  // The whole state from the store in place of the engine's: at a start (`restart`: audit entries and ended
  // leases kept for GET, running leases' heartbeat clocks started afresh) or, in kLocal, before every call.
  void load_whole_state(int64_t now_ms, bool restart);
  // At a start: what the load found audited and stored, the waste list replayed, a clock set back followed.
  void start_from_store();
  ApiResponse run_local(const std::function<ApiResponse()>& op);
  // Compares the wall clock with the monotonic clock since the last check; a step moves the engine's clocks.
  void follow_clock_locked();
  // The same for kLocal, whose processes share the store: the reference is kept in it (meta).
  void follow_shared_clock_locked(int64_t now_ms);
  // The reports answered from the board since the last merge, into the engine and the tracker.
  void merge_reports_locked();
  void count_committed(const Changes& changes);
  void fold_old_heartbeats();
  void note_write_failed();
  // A follower's attempt to lead (at the start and every tick): on success the whole state is loaded and the
  // store fenced with the new epoch, as a start does; the gap since the last leader's heartbeats is credited the
  // way a restart's is (running leases get a fresh heartbeat clock).
  void try_to_lead_locked();
  // The lead is lost (its database session ended, a write was fenced): nothing more is served from this state.
  void step_down_locked(const std::string& why);
  // A gap of more than outage_after_ms since the last saved tick (or the last crediting) is quotad's own outage:
  // credited to the leases before anything else is served, so that the first heartbeat after a long stall finds
  // its lease's clock already moved (not expired, not billed as a gap).
  void credit_outage_locked();
  void set_leader(std::string address);

  const ServiceOptions options_;
  std::atomic<EngineMode> mode_;
  std::unique_ptr<PostgresLeadership> leadership_;
  mutable std::mutex leader_mutex_;  // guards leader_ (read by refusals outside the engine lock)
  std::string leader_;
  HeartbeatBoard& board_;
  std::function<int64_t()> clock_;
  std::function<int64_t()> monotonic_;
  std::string local_clock_id_;  // which monotonic clock kLocal's stored offset refers to (set once)
  // Guards engine_, tracker_ and clock_offset_ms_; held across a state change's store write, so nothing that
  // answers heartbeats may wait for it.
  std::mutex mutex_;
  Engine engine_;
  UtilTracker tracker_;
  int64_t clock_offset_ms_ = 0;  // wall minus monotonic at the last check
  // Guards the store's connection, which heartbeat flushes and audit reads use outside the engine lock; taken
  // after mutex_ when both are held.
  std::mutex store_mutex_;
  std::atomic<int64_t> next_fold_ms_{0};  // wall time of the next fold_heartbeats
  std::unique_ptr<StateStore> store_;
  std::string receipt_key_;
  std::atomic<int64_t> last_tick_ms_{0};                             // monotonic: the last saved tick
  std::atomic<std::chrono::steady_clock::rep> store_down_until_{0};  // steady clock: changes fail fast until then
  std::atomic<uint64_t> preemptions_total_{0};
  std::atomic<uint64_t> emergency_total_{0};
  std::atomic<uint64_t> storage_write_errors_{0};
};

}  // namespace yolo8::quota
