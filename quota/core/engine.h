#pragma once
// The lease policy engine: deterministic, no I/O, time passed in by the caller (UTC milliseconds). It validates
// requests, applies the scheduler's decisions (scheduler.h), audits and records what changed for the store.
#include <cstdint>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "quota/core/cluster_state.h"
#include "quota/core/ledger.h"
#include "quota/core/policy.h"
#include "quota/core/receipt.h"
#include "quota/core/scheduler.h"

namespace yolo8::quota {

// A restore (quotad repair-db) opens a new id epoch: every id sequence continues at the next multiple of this
// above every id the restored state knows (store.h, next_id_epoch), so ids below the current epoch's first id are
// never handed out again.
inline constexpr int64_t kIdEpochSpan = 1000000000;

struct Approval {
  int64_t id = 0;
  int64_t lease_id = 0;
  std::string team;
  std::string user;
  std::string model;
  std::string justification;
  ApprovalState state = ApprovalState::kPending;
  std::string decided_by;
  std::string note;
  int64_t created_ms = 0;
  int64_t decided_ms = 0;
};

struct AuditEntry {
  int64_t seq = 0;  // increasing, never reused
  int64_t ts_ms = 0;
  std::string actor;
  // Stays text: the log is append-only history, so entries whose action an older or newer quotad wrote
  // ("lease.released", "approval.requested", ...) must load and show as they are. An open set.
  std::string action;
  int64_t lease_id = 0;
  std::string team;
  std::string detail;
};

// The in-memory tail of the audit log: appended to, its oldest entries dropped (prune). Full blocks of entries are
// shared between copies, so that a snapshot of the engine's state does not copy ten thousand entries.
class AuditLog {
 public:
  class const_iterator {
   public:
    using iterator_category = std::bidirectional_iterator_tag;
    using value_type = AuditEntry;
    using difference_type = std::ptrdiff_t;
    using pointer = const AuditEntry*;
    using reference = const AuditEntry&;
    const_iterator() = default;
    const_iterator(const AuditLog* log, size_t index) : log_(log), index_(index) {}
    reference operator*() const { return (*log_)[index_]; }
    pointer operator->() const { return &(*log_)[index_]; }
    const_iterator& operator++() { return ++index_, *this; }
    const_iterator operator++(int) { return {log_, index_++}; }
    const_iterator& operator--() { return --index_, *this; }
    const_iterator operator--(int) { return {log_, index_--}; }
    bool operator==(const const_iterator& other) const { return index_ == other.index_ && log_ == other.log_; }
    bool operator!=(const const_iterator& other) const { return !(*this == other); }

   private:
    const AuditLog* log_ = nullptr;
    size_t index_ = 0;
  };
  using const_reverse_iterator = std::reverse_iterator<const_iterator>;

  AuditLog() = default;
  explicit AuditLog(std::vector<AuditEntry> entries);
  void push_back(AuditEntry entry);
  // Keeps the newest `count` entries.
  void keep_last(size_t count);
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  const AuditEntry& operator[](size_t index) const;
  const AuditEntry& front() const { return (*this)[0]; }
  const AuditEntry& back() const { return (*this)[size_ - 1]; }
  const_iterator begin() const { return {this, 0}; }
  const_iterator end() const { return {this, size_}; }
  const_reverse_iterator rbegin() const { return const_reverse_iterator(end()); }
  const_reverse_iterator rend() const { return const_reverse_iterator(begin()); }

 private:
  static constexpr size_t kBlock = 256;
  std::vector<std::shared_ptr<const std::vector<AuditEntry>>> blocks_;  // full, never changed once shared
  std::vector<AuditEntry> tail_;                                        // the newest entries, fewer than kBlock
  size_t skip_ = 0;  // entries at the front of the first block (or the tail) no longer in the log
  size_t size_ = 0;
};

struct AcquireResult {
  // Its text (to_string) is the "status" field of the API's answer to a lease request.
  enum class Kind {
    kGranted,
    kQueued,
    kNeedsApproval,
    kNotAllowed,
    kAdmissionRefused,
    kCreditsSpent,
    kTooManyQueued,  // the user already has limits.max_queued_per_user requests waiting
    kInvalid
  };
  Kind kind = Kind::kInvalid;
  int64_t lease_id = 0;
  int64_t approval_id = 0;
  int position = 0;   // 1-based queue position
  int max_batch = 0;  // admission refusals: largest total batch that fits (0: none)
  double needed_gib = 0;
  std::string memory_row;  // the memory table row admission used (file, figures, provenance); "" without one
  std::string reason;
  bool replayed = false;  // answered from the idempotency key
};

std::string to_string(AcquireResult::Kind kind);

struct HeartbeatResult {
  bool found = false;
  LeaseState state = LeaseState::kExpired;
  int64_t deadline_ms = 0;
  int position = 0;
  std::string reason;
};

// The answer to a grant receipt presented for a lease this quotad does not hold (Engine::reattach).
struct ReattachResult {
  enum class Kind {
    kReattached,
    kBadSignature,  // forged, altered, or signed under another database's key
    kWrongUser,     // the caller is not the receipt's user
    kHeld,          // the id is one this quotad holds (or held): heartbeat it, or it has ended
    kCurrentEpoch,  // the id belongs to the current id epoch: it was never lost with a restore
    kDevicesTaken,  // a GPU of the receipt is held by another lease now
    kNotAdmitted,   // the team's limit, or the policy (team, user, GPUs no longer in it), does not admit it now
  };
  Kind kind = Kind::kBadSignature;
  std::string reason;
};

struct TeamStatus {
  std::string name;
  double base = 0, burst = 0, limit_now = 0, in_use = 0;
  bool in_burst_window = false;
  int leases_active = 0, queued = 0, pending_approval = 0;
};

// Everything the engine changed since the last take_changes(), for one storage transaction.
struct Changes {
  std::set<int64_t> leases;
  std::set<int64_t> approvals;
  std::vector<AuditEntry> audit;
  std::set<std::pair<std::string, std::string>> usage;  // (user, month)
  std::set<int64_t> loans;
  std::set<int64_t> grants;
  // Lease rows restore() found breaking an invariant (two leases on one GPU, more GPUs than the inventory): no
  // longer in the engine; the store moves each row to its quarantine table with the reason.
  struct Quarantined {
    std::string why;
    int64_t at_ms = 0;
  };
  std::map<int64_t, Quarantined> quarantined;
  bool empty() const {
    return leases.empty() && approvals.empty() && audit.empty() && usage.empty() && loans.empty() && grants.empty() &&
           quarantined.empty();
  }
};

// Everything the engine changes, as one value: a snapshot is a copy, a rollback an assignment, a load (a restart,
// later a follower's takeover) a construction. The policy, and the inventory derived from it, are configuration.
struct EngineState {
  std::map<int64_t, Lease> leases;
  std::map<int64_t, Approval> approvals;
  AuditLog audit;  // the latest entries only (prune); the store keeps them all
  std::map<std::pair<std::string, std::string>, double> usage;         // (user, month) -> GPU-hours
  std::map<std::pair<std::string, std::string>, int64_t> idempotency;  // (user, key) -> lease
  std::map<int64_t, Loan> loans;
  std::map<int64_t, CreditGrant> grants;
  int64_t next_loan = 1;
  int64_t next_grant = 1;
  int64_t next_lease = 1;
  int64_t next_approval = 1;
  int64_t next_audit_seq = 1;
  Changes changes;                     // since the last take_changes()
  std::vector<int64_t> queue;          // queued ids in order (order_queue)
  std::map<int64_t, int> queue_index;  // id -> position - 1
  FairUsage fair_usage;
};

class Engine {
 public:
  explicit Engine(Policy policy);

  const Policy& policy() const { return policy_; }
  // A reloaded policy in place of the running one, leases, queue and ledger kept. Throws PolicyError (the running
  // policy kept) when it is invalid, when reload_refusal() says it needs a restart, or when it drops a team or
  // user that still has a live lease.
  void replace_policy(Policy policy);

  AcquireResult acquire(const LeaseRequest& req, int64_t now_ms);
  // The answer acquire() would give now for an existing lease (used for idempotent replays and polling).
  AcquireResult status_of(int64_t lease_id, int64_t now_ms) const;
  // A heartbeat: last seen (a running lease's stored with it, so that local mode's reloads keep it), telemetry.
  HeartbeatResult heartbeat(int64_t lease_id, const Telemetry& telemetry, int64_t now_ms);
  // A heartbeat quotad answered from memory while the engine was busy: only the last-seen time (never moved
  // back) and the reported telemetry. Unknown or ended leases are ignored.
  void touch(int64_t lease_id, const Telemetry& telemetry, int64_t seen_ms);
  // quotad itself could not serve from `from_ms` to `to_ms` (stalled, stopped, restarting): the heartbeat clocks
  // of running and queued leases and the deadlines of revoking ones move by that time, so nobody loses a lease
  // for quotad's own unavailability. Billing stays with the last sign of life (charge): the outage is billed only
  // to a trainer heard from again after it. Audited as `quotad.outage`.
  void credit_outage(int64_t from_ms, int64_t to_ms);
  // The wall clock stepped by `step_ms` against the monotonic clock (an NTP correction, a hand-set date): the
  // clocks of live leases (last seen, granted, charged until, deadlines, GPUs' return) move with it, so that
  // expiry, deadlines and billing go by the time that really passed, not by the step. A time the step would put
  // after `now_ms` is capped at it. Audited as `clock.step`.
  void clock_stepped(int64_t step_ms, int64_t now_ms);
  // Queued lease ids in queue order, kept by every change (positions are index + 1).
  const std::vector<int64_t>& queue_ids() const { return state_.queue; }
  FairShare fair_share(const std::string& team, const std::string& user, int64_t now_ms) const;
  // Why a queued lease waits (the `reason` of status_of without its queue position); "" for others.
  std::string waiting_reason(int64_t lease_id, int64_t now_ms) const;
  // A lease a restored database lacks (granted after the backup), presented by `caller` with its grant receipt
  // signed under `key`: re-admitted with its id, GPUs, share and grant time when the signature holds, the caller is
  // the receipt's user, the id lies below the current id epoch (next_lease_id(): ids there are never handed out
  // again) and is not held, its GPUs are free now and the team's limit admits it (critical leases: the emergency
  // pool, as at a grant). Credits are not checked again: the work was admitted when granted and is billed anyway,
  // from the receipt's grant time (nothing of it is in this database). Audited as `lease.reattach`.
  // `recorded`: the store holds a row with this id (a lease ended long ago, no longer loaded): refused as held.
  ReattachResult reattach(const LeaseReceipt& receipt, const std::string& key, const std::string& caller, bool recorded,
                          int64_t now_ms);
  // Queued / pending leases may be cancelled by releasing them. False if unknown or already ended.
  bool release(int64_t lease_id, Outcome outcome, int64_t now_ms, const std::string& actor = "");
  // Moves an approved request into the queue. Throws PolicyError if not pending.
  void approve(int64_t approval_id, const std::string& by, int64_t now_ms, const std::string& note = "");
  void reject(int64_t approval_id, const std::string& by, int64_t now_ms, const std::string& note = "");
  // Closes the after-the-fact review of an emergency lease. Throws PolicyError if none is pending.
  void review_emergency(int64_t lease_id, const std::string& by, int64_t now_ms, const std::string& note);
  // An audit entry about no lease (failed authentications, ...).
  void note(int64_t now_ms, const std::string& actor, const std::string& action, const std::string& detail);
  // Expiry, preemption deadlines, credit accrual and the queue; call every second or so.
  void tick(int64_t now_ms);

  const Lease* find(int64_t lease_id) const;
  const Approval* find_approval(int64_t approval_id) const;
  const std::map<int64_t, Lease>& leases() const { return state_.leases; }
  const std::map<int64_t, Approval>& approvals() const { return state_.approvals; }
  const AuditLog& audit() const { return state_.audit; }
  std::vector<TeamStatus> teams(int64_t now_ms) const;
  int queue_position(int64_t lease_id) const;
  double team_units(const std::string& team, int64_t now_ms) const;
  // GPU-hours charged to `user` in `month`, including the running leases' unbilled time.
  double used_gpu_hours(const std::string& user, const std::string& month, int64_t now_ms) const;
  double credit_allowance(const std::string& user, const std::string& month, int64_t now_ms) const;
  const std::map<std::pair<std::string, std::string>, double>& usage() const { return state_.usage; }
  // The figures behind credit_allowance().
  MonthCredit month_credit_of(const std::string& user, const std::string& month) const;

  // Loan applications and contribution credits (defined in ledger.cpp). Refusals throw LedgerError.
  // `user` applies for `gpu_hours` more this month; a lead of the user's team or an admin decides, never the
  // applicant. Approved loans raise the month's allowance; the overrun is repaid from the next month's credits.
  // A repeated `idempotency_key` of the same user returns the loan it created, unchanged (`replayed` set).
  const Loan& apply_loan(const std::string& user, double gpu_hours, const std::string& justification, int64_t now_ms,
                         const std::string& idempotency_key = "", bool* replayed = nullptr);
  const Loan& decide_loan(int64_t loan_id, bool approve, const std::string& by, const std::string& note,
                          int64_t now_ms);
  // `by` credits `user` with `gpu_hours` this month for a contribution (`reason`), within the quarter's cap.
  const CreditGrant& grant_credits(const std::string& user, double gpu_hours, const std::string& reason,
                                   const std::string& by, int64_t now_ms);
  // Month rollover (called by tick): loans of ended months are settled (repaid or expired), audited.
  void settle_loans(int64_t now_ms);
  const Loan* find_loan(int64_t loan_id) const;
  const std::map<int64_t, Loan>& loans() const { return state_.loans; }
  const std::map<int64_t, CreditGrant>& grants() const { return state_.grants; }
  double granted_gpu_hours(const std::string& user, const std::string& month) const;
  // `next_loan_id` / `next_grant_id`: the store's sequences (ids of rows no longer loaded are not reused).
  void restore_ledger(std::vector<Loan> loans, std::vector<CreditGrant> grants, int64_t next_loan_id = 1,
                      int64_t next_grant_id = 1);

  // Every broken invariant, empty when sound (never more memory than a GPU has, pool kept, a pinned lease on its
  // GPUs, ...).
  std::vector<std::string> check_invariants(int64_t now_ms) const;

  // The GPUs a request is pinned to, where the trainer already runs: those with its visible UUIDs (where the
  // inventory lists them), else its node's; none when the request names neither (or the inventory knows neither).
  using Pin = quota::Pin;
  Pin pin_of(const LeaseRequest& req) const;
  // The lease's GPUs ("node-c:2") and, where the trainer reported them, its node, the GPUs it sees and how the
  // lease was matched to them: "node-c:2 (trainer on node-c sees GPU-...), matched by UUID". Audit and status page.
  std::string describe_devices(const Lease& lease) const;
  // Whether a lease of `lease_gpus` guaranteed GPUs pinned to `pin` holds all the pinned GPUs plus GPUs elsewhere:
  // a multi-pod job (an indexed DDP Job) whose requester sees fewer GPUs than the job runs on.
  static bool pin_spills(const Pin& pin, int lease_gpus);

  Changes take_changes();
  // The whole state as one value: a snapshot is a copy of it, a rollback or a takeover load(). A change the store
  // could not save is undone by loading the snapshot taken before it.
  const EngineState& state() const { return state_; }
  EngineState snapshot() const { return state_; }
  // In place of the running state (the policy kept): what snapshot() returned, or a leader's state.
  void load(EngineState state) { state_ = std::move(state); }
  // Rebuilds state from storage.
  // `audit` may be only the latest entries; `next_audit_seq` continues the numbering. A restart
  // (`restart_now_ms` > 0) gives running leases a fresh heartbeat clock, since quotad's downtime is not theirs;
  // one no trainer heartbeats again ends a ttl later, billed to its last sign of life (charge).
  // The loaded leases are checked against the current inventory, each finding audited and left in
  // take_changes() for the store: a lease on GPUs the inventory no longer has (a node removed or renamed) moves to
  // the GPUs its trainer's UUIDs name where they are free, else it ends (expired, the node named); a row that
  // breaks an invariant (more GPUs than the inventory, a GPU another lease already holds) is quarantined.
  void restore(std::vector<Lease> leases, std::vector<Approval> approvals, std::vector<AuditEntry> audit,
               std::map<std::pair<std::string, std::string>, double> usage, int64_t next_audit_seq,
               int64_t restart_now_ms);
  // Ids are never reused: after restore() the store raises the counters to its persistent sequences, which
  // also count leases and approvals no longer loaded into memory.
  void reserve_ids(int64_t next_lease_id, int64_t next_approval_id);
  int64_t next_lease_id() const { return state_.next_lease; }
  int64_t next_approval_id() const { return state_.next_approval; }
  // Drops ended leases older than `keep_ms` from memory (they stay in storage); an emergency lease whose review
  // is still pending stays until it is reviewed.
  void prune(int64_t now_ms, int64_t keep_ms);

 private:
  // The state the scheduler decides from, a view of this engine's (no copy).
  ClusterState cluster_state(int64_t now_ms) const;
  // Runs the scheduler (scheduler.h) and applies its decision: grants, revocations, the queue; audited.
  void schedule(int64_t now_ms);
  void end_lease(Lease& lease, LeaseState state, Outcome outcome, int64_t end_ms, int64_t free_at_ms,
                 const std::string& reason, const std::string& actor);
  // The billing rule: a running lease's GPU time is billed up to its last sign of life (last_seen_ms: a
  // heartbeat or poll received from its trainer) plus at most one heartbeat interval, and never past `until_ms`
  // (now, or its end). Time between two signs of life is billed whole (the trainer kept training), unless the
  // second came after the lease's heartbeat deadline (then skipped: seen). So an expired lease is billed to its
  // last heartbeat + interval, not to its expiry; a late release likewise; quotad's outage credit and a
  // restart's fresh heartbeat clock (expiry_clock) bill nothing unless the trainer is heard from again.
  // Charged-until moves to what was billed (billable_until, the one place the rule is applied).
  void charge(Lease& lease, int64_t until_ms);
  int64_t billable_until(const Lease& lease, int64_t until_ms) const;
  // A sign of life at `seen_ms` (a heartbeat, a poll): one after the heartbeat deadline (an unreported clock
  // step, a history without heartbeats) bills the gap before it as the lease's end would, the rest skipped.
  void seen(Lease& lease, int64_t seen_ms);
  // The time the ttl counts from: the last sign of life or, later, where quotad moved the heartbeat clock.
  static int64_t expiry_clock(const Lease& lease);
  void log(int64_t now_ms, const std::string& actor, const std::string& action, const Lease* lease,
           const std::string& detail);
  // Recomputes the queue order (and the fair-share factors in it); called once per change, read by the rest.
  void order_queue(int64_t now_ms);
  void set_queue(const std::vector<QueueEntry>& order);
  std::string queue_reason(const Lease& lease, int64_t now_ms) const;
  std::string fair_share_text(const Lease& lease, int64_t now_ms) const;
  // The ledger's invariants (ledger.cpp): loans and grants within the policy's caps, repaid <= borrowed.
  void check_ledger(std::vector<std::string>& errors) const;
  void log_team(int64_t now_ms, const std::string& actor, const std::string& action, const std::string& team,
                const std::string& detail);

  // restore()'s check of the loaded leases; `missing`: per lease, the stored device ids the inventory lacks.
  void check_loaded(int64_t now_ms, std::map<int64_t, std::vector<std::string>> missing);
  // Why `req` names a node or GPU UUIDs the inventory contradicts; "" when it does not.
  std::string pin_refusal(const LeaseRequest& req) const;
  // GPUs the lease guarantees (the request's, before any per-job burst).
  int guaranteed_gpus(const Lease& lease) const;

  Policy policy_;
  Inventory inventory_;
  EngineState state_;
};

}  // namespace yolo8::quota
