#pragma once
// What the scheduler decides from (scheduler.h): the lease records, the inventory's index of GPUs, the decayed
// usage behind the fair share, the policy and the time. The engine owns them; ClusterState is a view of them.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

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
  int max_gpus = 0;       // per-job burst: up to this many GPUs while they are idle; 0 = gpus
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
  // NVML per process: this process's memory on its leased device as nvidia-smi's process list shows it, the CUDA
  // context included (on a shared GPU the device figure above is every lease's sum)
  double process_memory_used_gib = -1;
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
// Takes a heartbeat's report into the latest figures: every figure it gives (and its memory context); the
// figures it leaves out keep their last value. The one merge for the engine and the service's heartbeat board.
void merge_telemetry(Telemetry& into, const Telemetry& from);

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
  int64_t last_seen_ms = 0;  // the last sign of life received from the trainer (heartbeat, poll): billing
  // The heartbeat clock where quotad moved it past last_seen_ms (its outage credit, a restart): the ttl counts
  // from the later of the two (Engine::expiry_clock), billing from last_seen_ms only. 0: never moved.
  int64_t heartbeat_clock_ms = 0;
  int64_t deadline_ms = 0;  // revoking: release by then
  int64_t ended_ms = 0;
  int64_t free_at_ms = 0;           // expired: GPUs return at this time
  int64_t charged_until_ms = 0;     // billed up to here (Engine::charge)
  double gpu_hours = 0;             // charged so far
  int64_t preempted_for = 0;        // the waiting lease this victim makes room for
  std::vector<int64_t> waiting_on;  // victims this queued lease waits for
  std::string reason;               // why queued / why it ended
  Telemetry telemetry;

  // Share of GPUs counted against the team limit and credits.
  double units(const Policy& policy) const;
  bool holds_gpus(int64_t now_ms) const;
};

// A team's and a user's standing in the fair share: recent use (GPU-hours decayed with
// fair_share.half_life_h) as a fraction of all recent use, against the normalised share.
struct FairShare {
  double factor = 1;  // 2^(-team usage/team share) x 2^(-user usage/user share); 1 without recent use
  double team_gpu_hours = 0, team_usage = 0, team_share = 0;
  double user_gpu_hours = 0, user_usage = 0, user_share = 0;  // user: within the team
};

// The inventory's GPUs by UUID and by node, derived from Policy::gpus once.
struct Inventory {
  explicit Inventory(const Policy& policy);
  std::map<std::string, int> uuid_index;                 // lower-case GPU UUID -> index into Policy::gpus
  std::map<std::string, std::vector<int>> node_devices;  // node -> its GPUs' indices
};

// The GPUs a request is pinned to, where the trainer already runs (pin_of in scheduler.h).
struct Pin {
  std::vector<int> devices;  // indices into Policy::gpus, ascending
  bool by_uuid = false;
  bool by_index = false;  // the GPUs the trainer asked for (LeaseRequest::node_gpus)
  std::string text;       // for messages: "node-a", "GPU 2 of node-a" or "GPU-...,GPU-... on node-a"
};

// Recent use for the fair share, decayed with fair_share.half_life_h: "team:<name>" / "user:<name>" -> GPU-hours
// as of a time.
struct Decayed {
  double value = 0;
  int64_t as_of_ms = 0;
};
using FairUsage = std::map<std::string, Decayed>;

// Everything a scheduling decision reads, and nothing else. Leases that neither hold GPUs nor wait may be in
// `leases` or not: no decision reads them.
struct ClusterState {
  const Policy& policy;
  const Inventory& inventory;
  const std::map<int64_t, Lease>& leases;
  const FairUsage& usage;
  int64_t now_ms = 0;
};

}  // namespace yolo8::quota
