#pragma once
// The pure lease policy engine: deterministic, no I/O, time passed in by the caller (UTC milliseconds).
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "quota/core/ledger.h"
#include "quota/core/policy.h"

namespace yolo8::quota {

// Typed states; the text forms (to_string / parse_*) are the wire and storage format and must not change.
// The parsers throw PolicyError naming the field and the accepted values.
enum class LeaseState { kPendingApproval, kQueued, kGranted, kRevoking, kReleased, kExpired, kRejected };
enum class Outcome { kNone, kCompleted, kPreempted, kFailed, kCancelled };
// An approval is cancelled when its lease is released while still waiting for the decision.
enum class ApprovalState { kPending, kApproved, kRejected, kCancelled };
std::string to_string(LeaseState state);
LeaseState parse_lease_state(const std::string& text);
std::string to_string(Outcome outcome);
Outcome parse_outcome(const std::string& text);  // "" is Outcome::kNone
std::string to_string(ApprovalState state);
ApprovalState parse_approval_state(const std::string& text);
bool is_terminal(LeaseState state);

struct LeaseRequest {
  std::string team;
  std::string user;
  std::string job;
  std::string model = "yolov8n";
  int imgsz = 640;
  int batch = 0;          // images per step over all GPUs; 0 = auto (the trainer fits it)
  int gpus = 0;           // 0 = policy default; the guaranteed GPUs
  int max_gpus = 0;       // per-job burst (issue 19): up to this many GPUs while they are idle; 0 = gpus
  double memory_gib = 0;  // per GPU: the share for shared leases, a minimum GPU size otherwise
  Priority priority = Priority::kNormal;
  bool preemptible = true;
  bool shared = false;  // share a GPU by memory when the policy allows
  std::string justification;
  std::string idempotency_key;
  // Where the trainer runs when something else chose its GPUs (Kubernetes' device plugin): its node and the GPU
  // UUIDs it sees (NVIDIA_VISIBLE_DEVICES). They pin the lease (Engine::pin_of): to the GPUs with those UUIDs
  // where the inventory lists UUIDs, else to the node's GPUs. Recorded with the lease and in the audit.
  std::string node;
  std::vector<std::string> visible_devices;
  // The GPUs of `node` the trainer was told to use (device=, as the node numbers them): the lease goes on exactly
  // those, or waits for them. Ignored without a node, and where the UUIDs matched.
  std::vector<int> node_gpus;
  // The authenticated caller when it is not `user` (an admin acting on someone's behalf); set by the service,
  // never taken from a request body. The audit names both.
  std::string requested_by;
};

// Per-heartbeat figures the trainer reports (kept for the metrics work; negative = not reported).
struct Telemetry {
  int64_t step = -1;
  int epoch = -1;
  double gpu_util = -1;         // 0..1
  std::string gpu_util_source;  // "nvml" (the devices' own figure), "busy_time" (share of time in steps), "" unsaid
  double memory_used_gib = -1;  // peak per GPU
  double device_memory_used_gib = -1;  // NVML: memory in use on the busiest leased device, every process's
  int64_t last_checkpoint_ms = 0;
  // What the peak was measured with, so that quotad can learn the memory table from real runs
  // (`quotad memory-table --observed`); empty / -1 = not reported.
  std::string model;
  int imgsz = -1;
  int batch = -1;  // images per GPU
  int amp = -1;    // 1 AMP, 0 float32
  std::string device_name;
  std::string libtorch;  // LibTorch version of the trainer ("2.1.2"); "" when an older trainer did not say
  // A sample quotad can learn from: a peak with everything it depends on.
  bool is_memory_observation() const {
    return memory_used_gib > 0 && !model.empty() && imgsz > 0 && batch > 0 && amp >= 0 && !device_name.empty();
  }
};

// Copies what a memory sample was measured with (model, imgsz, batch, AMP, device, LibTorch) from a report,
// where given.
void merge_memory_context(Telemetry& into, const Telemetry& from);

struct Lease {
  int64_t id = 0;
  LeaseRequest req;
  LeaseState state = LeaseState::kQueued;
  Outcome outcome = Outcome::kNone;
  int gpus = 1;
  // Per GPU. Shared: the share. Whole: while queued the least GPU memory it needs; once granted the memory of
  // its (smallest) GPU, which is what the holder may use.
  double memory_gib = 0;
  bool shared = false;
  std::vector<int> devices;             // indices into Policy::gpus
  std::vector<std::string> device_ids;  // "node:index" as stored; restore() maps them onto the current policy
  bool over_base = false;               // granted beyond the team's base (a burst lease)
  int extra_gpus = 0;                   // per-job burst: GPUs granted beyond req.gpus from idle capacity
  bool emergency = false;
  bool review_pending = false;
  int64_t approval_id = 0;
  int64_t created_ms = 0;
  int64_t granted_ms = 0;
  int64_t last_seen_ms = 0;
  int64_t deadline_ms = 0;  // revoking: release by then
  int64_t ended_ms = 0;
  int64_t free_at_ms = 0;  // expired: GPUs return at this time
  int64_t charged_until_ms = 0;
  double gpu_hours = 0;             // charged so far
  int64_t preempted_for = 0;        // the waiting lease this victim makes room for
  std::vector<int64_t> waiting_on;  // victims this queued lease waits for
  std::string reason;               // why queued / why it ended
  Telemetry telemetry;

  // Share of GPUs counted against the team limit and credits.
  double units(const Policy& policy) const;
  bool holds_gpus(int64_t now_ms) const;
};

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

// A team's and a user's standing in the fair share (issue 19): recent use (GPU-hours decayed with
// fair_share.half_life_h) as a fraction of all recent use, against the normalised share.
struct FairShare {
  double factor = 1;  // 2^(-team usage/team share) x 2^(-user usage/user share); 1 without recent use
  double team_gpu_hours = 0, team_usage = 0, team_share = 0;
  double user_gpu_hours = 0, user_usage = 0, user_share = 0;  // user: within the team
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
  bool empty() const {
    return leases.empty() && approvals.empty() && audit.empty() && usage.empty() && loans.empty() && grants.empty();
  }
};

class Engine {
 public:
  explicit Engine(Policy policy);

  const Policy& policy() const { return policy_; }

  AcquireResult acquire(const LeaseRequest& req, int64_t now_ms);
  // The answer acquire() would give now for an existing lease (used for idempotent replays and polling).
  AcquireResult status_of(int64_t lease_id, int64_t now_ms) const;
  HeartbeatResult heartbeat(int64_t lease_id, const Telemetry& telemetry, int64_t now_ms);
  // A heartbeat quotad answered from memory while the engine was busy: only the last-seen time (never moved
  // back) and the reported telemetry. Unknown or ended leases are ignored.
  void touch(int64_t lease_id, const Telemetry& telemetry, int64_t seen_ms);
  // quotad itself could not serve from `from_ms` to `to_ms` (stalled, stopped, restarting): the heartbeat clocks
  // of running and queued leases and the deadlines of revoking ones move by that time, so nobody loses a lease
  // for quotad's own unavailability. Audited as `quotad.outage`.
  void credit_outage(int64_t from_ms, int64_t to_ms);
  // Queued lease ids in queue order, kept by every change (positions are index + 1).
  const std::vector<int64_t>& queue_ids() const { return queue_; }
  FairShare fair_share(const std::string& team, const std::string& user, int64_t now_ms) const;
  // Why a queued lease waits (the `reason` of status_of without its queue position); "" for others.
  std::string waiting_reason(int64_t lease_id, int64_t now_ms) const;
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
  const std::map<int64_t, Lease>& leases() const { return leases_; }
  const std::map<int64_t, Approval>& approvals() const { return approvals_; }
  const std::vector<AuditEntry>& audit() const { return audit_; }
  std::vector<TeamStatus> teams(int64_t now_ms) const;
  int queue_position(int64_t lease_id) const;
  double team_units(const std::string& team, int64_t now_ms) const;
  // GPU-hours charged to `user` in `month`, including the running leases' unbilled time.
  double used_gpu_hours(const std::string& user, const std::string& month, int64_t now_ms) const;
  double credit_allowance(const std::string& user, const std::string& month, int64_t now_ms) const;
  const std::map<std::pair<std::string, std::string>, double>& usage() const { return usage_; }
  // The figures behind credit_allowance().
  MonthCredit month_credit_of(const std::string& user, const std::string& month) const;

  // Loan applications and contribution credits (issue 19; defined in ledger.cpp). Refusals throw LedgerError.
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
  const std::map<int64_t, Loan>& loans() const { return loans_; }
  const std::map<int64_t, CreditGrant>& grants() const { return grants_; }
  double granted_gpu_hours(const std::string& user, const std::string& month) const;
  // `next_loan_id` / `next_grant_id`: the store's sequences (ids of rows no longer loaded are not reused).
  void restore_ledger(std::vector<Loan> loans, std::vector<CreditGrant> grants, int64_t next_loan_id = 1,
                      int64_t next_grant_id = 1);

  // Every broken invariant, empty when sound (never more memory than a GPU has, pool kept, a pinned lease on its
  // GPUs, ...).
  std::vector<std::string> check_invariants(int64_t now_ms) const;

  // The GPUs a request is pinned to, where the trainer already runs: those with its visible UUIDs (where the
  // inventory lists them), else its node's; none when the request names neither (or the inventory knows neither).
  struct Pin {
    std::vector<int> devices;  // indices into Policy::gpus, ascending
    bool by_uuid = false;
    bool by_index = false;  // the GPUs the trainer asked for (LeaseRequest::node_gpus)
    std::string text;       // for messages: "node-a", "GPU 2 of node-a" or "GPU-...,GPU-... on node-a"
  };
  Pin pin_of(const LeaseRequest& req) const;
  // The lease's GPUs ("node-c:2") and, where the trainer reported them, its node, the GPUs it sees and how the
  // lease was matched to them: "node-c:2 (trainer on node-c sees GPU-...), matched by UUID". Audit and status page.
  std::string describe_devices(const Lease& lease) const;
  // Whether a lease of `lease_gpus` guaranteed GPUs pinned to `pin` holds all the pinned GPUs plus GPUs elsewhere:
  // a multi-pod job (an indexed DDP Job) whose requester sees fewer GPUs than the job runs on.
  static bool pin_spills(const Pin& pin, int lease_gpus) {
    return !pin.devices.empty() && static_cast<size_t>(lease_gpus) > pin.devices.size();
  }

  Changes take_changes();
  // Rebuilds state from storage.
  // `audit` may be only the latest entries; `next_audit_seq` continues the numbering. A restart
  // (`restart_now_ms` > 0) gives running leases a fresh heartbeat clock, since quotad's downtime is not theirs.
  void restore(std::vector<Lease> leases, std::vector<Approval> approvals, std::vector<AuditEntry> audit,
               std::map<std::pair<std::string, std::string>, double> usage, int64_t next_audit_seq,
               int64_t restart_now_ms);
  // Ids are never reused: after restore() the store raises the counters to its persistent sequences, which
  // also count leases and approvals no longer loaded into memory.
  void reserve_ids(int64_t next_lease_id, int64_t next_approval_id);
  int64_t next_lease_id() const { return next_lease_; }
  int64_t next_approval_id() const { return next_approval_; }
  // Drops ended leases older than `keep_ms` from memory (they stay in storage); an emergency lease whose review
  // is still pending stays until it is reviewed.
  void prune(int64_t now_ms, int64_t keep_ms);

 private:
  struct Placement {
    std::vector<int> devices;
  };
  // GPUs held by the leases `match` selects (emergency ones and `ignore` left out): whole leases count their
  // GPUs, and a GPU carrying any of their shared leases counts whole.
  double held_gpus(const std::function<bool(const Lease&)>& match, int64_t now_ms,
                   const std::set<int64_t>& ignore) const;
  // GPUs `lease` would add to its team's count on `devices`: 0 for a shared lease joining a GPU its team holds.
  double added_gpus(const Lease& lease, const std::vector<int>& devices, int64_t now_ms) const;
  std::optional<Placement> place(const Lease& lease, int64_t now_ms, const std::set<int64_t>& ignore) const;
  bool try_grant(Lease& lease, int64_t now_ms);
  bool try_preempt(Lease& lease, int64_t now_ms);
  void schedule(int64_t now_ms);
  void end_lease(Lease& lease, LeaseState state, Outcome outcome, int64_t end_ms, int64_t free_at_ms,
                 const std::string& reason, const std::string& actor);
  void charge(Lease& lease, int64_t until_ms);
  void log(int64_t now_ms, const std::string& actor, const std::string& action, const Lease* lease,
           const std::string& detail);
  // Recomputes the queue order (and the fair-share factors in it); called once per change, read by the rest.
  void order_queue(int64_t now_ms);
  void add_fair_usage(const Lease& lease, double gpu_hours, int64_t at_ms);
  double decayed(const std::string& key, int64_t now_ms) const;
  // Why `lease` may not start now for its user's cap; "" when within it.
  // `devices`: where it would go (a shared lease joining a GPU with the user's shares adds nothing); null: anywhere.
  std::string user_cap_reason(const Lease& lease, const std::vector<int>* devices, int64_t now_ms) const;
  std::string queue_reason(const Lease& lease, int64_t now_ms) const;
  std::string fair_share_text(const Lease& lease, int64_t now_ms) const;
  // The ledger's invariants (ledger.cpp): loans and grants within the policy's caps, repaid <= borrowed.
  void check_ledger(std::vector<std::string>& errors) const;
  void log_team(int64_t now_ms, const std::string& actor, const std::string& action, const std::string& team,
                const std::string& detail);

  // Why `req` names a node or GPU UUIDs the inventory contradicts; "" when it does not.
  std::string pin_refusal(const LeaseRequest& req) const;
  // GPUs the lease guarantees (the request's, before any per-job burst).
  int guaranteed_gpus(const Lease& lease) const;

  Policy policy_;
  std::map<std::string, int> uuid_index_;                 // lower-case GPU UUID -> index into Policy::gpus
  std::map<std::string, std::vector<int>> node_devices_;  // node -> its GPUs' indices
  std::map<int64_t, Lease> leases_;
  std::map<int64_t, Approval> approvals_;
  std::vector<AuditEntry> audit_;
  std::map<std::pair<std::string, std::string>, double> usage_;
  std::map<std::pair<std::string, std::string>, int64_t> idempotency_;  // (user, key) -> lease
  std::map<int64_t, Loan> loans_;
  std::map<int64_t, CreditGrant> grants_;
  int64_t next_loan_ = 1;
  int64_t next_grant_ = 1;
  int64_t next_lease_ = 1;
  int64_t next_approval_ = 1;
  int64_t next_audit_seq_ = 1;
  Changes changes_;
  std::vector<int64_t> queue_;          // queued ids in order (order_queue)
  std::map<int64_t, int> queue_index_;  // id -> position - 1
  struct Decayed {
    double value = 0;
    int64_t as_of_ms = 0;
  };
  std::map<std::string, Decayed> fair_usage_;  // "team:<name>" / "user:<name>" -> decayed GPU-hours
};

}  // namespace yolo8::quota
