#pragma once
// The department's GPU policy: inventory, teams, users, tiers, limits. Plain structs, validated in one place.
#include <climits>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "quota/core/calendar.h"  // the calendar the policy's windows and months use

namespace yolo8::quota {

// Bad policy or request data; the message names the file/line/key.
class PolicyError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class Priority { kLow = 0, kNormal = 1, kHigh = 2, kCritical = 3 };
std::string to_string(Priority priority);
Priority parse_priority(const std::string& text);  // throws PolicyError

struct Gpu {
  std::string node;
  int index = 0;  // index within the node
  double memory_gib = 0;
  std::string uuid;  // "GPU-..." / "MIG-..." from inventory.nodes[].uuids; "" when the node lists none
  std::string id() const { return node + ":" + std::to_string(index); }
};

// A node as the inventory lists it (Policy::gpus expands it); kept so that validate() can name its keys.
struct InventoryNode {
  std::string name;
  int gpus = 0;
  double memory_gib = 0;
  std::vector<std::string> uuids;  // one per GPU in index order, or none
};

// "GPU-" or "MIG-" and a UUID as NVML prints it (8-4-4-4-12 hex digits), or the older MIG form
// "MIG-GPU-<uuid>/<gi>/<ci>".
bool is_gpu_uuid(const std::string& text);
// ASCII lower case (GPU UUIDs compare without regard to the case of their hex digits).
std::string lower_case(std::string text);

// Weekday + local-time range; `utc_offset_min` comes from a time zone of the form "UTC" or "+HH:MM".
// Named IANA zones are not supported (no tz database dependency); DST must be handled by editing the offset.
struct BurstWindow {
  std::vector<int> weekdays;  // 0 = Monday .. 6 = Sunday
  int from_min = 0;           // minutes after local midnight, inclusive
  int to_min = 0;             // exclusive; to < from wraps past midnight
  int utc_offset_min = 0;
  std::string timezone = "UTC";
  bool contains(int64_t now_ms) const;
};

struct Team {
  std::string name;
  double base = 0;   // guaranteed GPUs
  double burst = 0;  // limit inside a burst window (>= base)
  std::vector<BurstWindow> burst_windows;
  std::vector<std::string> leads;
  std::vector<std::string> members;
  double share = -1;          // fair-share weight; < 0: the base
  int max_gpus_per_user = 0;  // GPUs one member of the team may hold at once; 0: no cap
  double share_weight() const { return share >= 0 ? share : base; }
  // Limit in force at `now_ms`: burst inside a window, base otherwise.
  double limit_at(int64_t now_ms) const;
  bool in_burst_window(int64_t now_ms) const;
};

enum class Role { kMember, kLead, kAdmin };

struct User {
  std::string name;
  std::string team;  // empty for admins without a team
  Role role = Role::kMember;
  std::string token_sha256;  // SHA-256 hex of token_salt + token
  std::string token_salt;    // per-token salt (hex); empty for an unsalted hash
  // A token being rotated out (previous_token_sha256 / previous_token_salt / previous_token_until): it keeps
  // authenticating beside the new one until a reload drops it or `until` passes, so trainers can switch tokens
  // without a gap. Empty: none.
  std::string previous_token_sha256;
  std::string previous_token_salt;
  int64_t previous_token_until_ms = 0;  // UTC ms; 0: until a reload drops it
};

struct MemoryEstimate {
  double fixed_gib = 0;      // weights, optimizer state, workspace
  double per_image_gib = 0;  // activations per image at imgsz 640
};

// Where a table's figures come from (`provenance:`; written by `yolo8 profile` and `quotad memory-table`).
struct MemoryProvenance {
  std::string device;     // "NVIDIA H200", "cpu"
  std::string precision;  // "amp" or "float32"
  std::string libtorch;   // LibTorch version
  std::string date;       // YYYY-MM-DD
};

// Training memory per GPU by model: configs/memory-table.yaml (estimates), or the table `yolo8 profile` or
// `quotad memory-table --observed` wrote (one schema: source, reference_imgsz, provenance, models).
struct MemoryTable {
  std::string file;    // where it was loaded from, for the admission answer
  std::string source;  // "estimate", "yolo8 profile ...", "observed ..."
  MemoryProvenance provenance;
  std::map<std::string, MemoryEstimate> models;
  // GPU memory a training process holds beyond its allocator's cap (the CUDA context and library workspaces), as
  // `yolo8 profile` measured it on the GPU: the process's memory as nvidia-smi shows it minus the allocator's
  // reserved bytes. -1: the table does not say (the policy's sharing.process_overhead_gib applies).
  double process_overhead_gib = -1;
  // Names the row used for `model` (file, figures, provenance), for the admission answer; "" when absent.
  std::string describe_row(const std::string& model) const;
  bool has(const std::string& model) const { return models.count(model) > 0; }
  // GiB for `batch_per_gpu` images at `imgsz` (activations scale with (imgsz/640)^2).
  double estimate_gib(const std::string& model, int imgsz, int batch_per_gpu) const;
  // Largest per-GPU batch fitting `memory_gib`; 0 when not even one image fits.
  int max_batch(const std::string& model, int imgsz, double memory_gib) const;
};

struct Policy {
  std::string source;  // file it came from, for messages
  // Line (1-based) of every key path the file defined ("teams.t.base", "inventory.nodes[0]"), so that
  // validate() can name the line of a semantic error.
  std::map<std::string, int> key_lines;
  std::vector<InventoryNode> nodes;  // as listed (empty for a policy built in code)
  std::vector<Gpu> gpus;
  std::map<std::string, Team> teams;
  std::map<std::string, User> users;
  double emergency_pool_fraction = 0.15;
  // emergency.max_gpus_per_request: the most GPUs a critical request by a non-admin may ask for; -1 (absent) is
  // the pool's size, so one member's emergency can never revoke more than the pool would have held
  int emergency_max_gpus_per_request = -1;
  // defaults for requests that declare nothing
  int default_gpus = 1;
  std::map<std::string, double> default_memory_gib;  // per model, for shared leases
  double default_memory_fallback_gib = 8;
  // tiers
  std::vector<std::string> self_service_models = {"yolov8n", "yolov8s"};
  std::vector<std::string> approval_models = {"yolov8l", "yolov8x"};
  bool unknown_models_need_approval = true;  // "custom" models
  // lease timing (seconds)
  int ttl_s = 60;
  int heartbeat_interval_s = 10;
  int expiry_grace_s = 30;
  // preemption
  int min_runtime_s = 300;
  int preempt_grace_s = 120;
  // sharing
  bool sharing_enabled = false;
  int max_leases_per_gpu = 4;
  std::vector<std::string> shared_models;  // models that may ask for a shared lease; empty = any model
  // sharing.process_overhead_gib: what each process on a shared GPU holds beyond its share, which caps only its
  // caching allocator. A documented default until measured on the GPU: the CUDA context and library workspaces
  // the allocator cap does not cover (about 0.5-1 GiB per process).
  double process_overhead_gib = 0.75;
  // The overhead placement adds to every shared lease on a GPU: the memory table's measured figure where it has
  // one, else sharing.process_overhead_gib.
  double shared_overhead_gib() const;
  // That figure and where it comes from, for `quotad check-policy` and the admission answer.
  std::string describe_shared_overhead() const;
  // Why `model` may not hold a shared lease of `lease_gpus` GPUs under this policy; "" when it may.
  std::string shared_refusal(const std::string& model, int lease_gpus) const;
  // credits, GPU-hours per member per month; 0 disables credits
  double monthly_gpu_hours = 100;
  double loan_gpu_hours = 0;
  // The loan above is granted without asking when `automatic_loan` is on (the behaviour before);
  // loan applications (POST /v1/loans) need a lead's approval, at most `loan_applications_per_month` per member
  // and month (0: none) and `max_loan_gpu_hours_per_month` GPU-hours in all; contribution credits granted to a
  // member are capped at `max_grant_gpu_hours_per_quarter` per quarter (0: no grants)
  bool automatic_loan = true;
  int loan_applications_per_month = 2;
  double max_loan_gpu_hours_per_month = 50;
  double max_grant_gpu_hours_per_quarter = 50;
  // request bounds
  int max_imgsz = 4096;
  int max_batch = 4096;
  int max_queued_per_user = 50;  // queued or pending requests one user may have at once (429 past it)
  // fair share: within a priority the queue is ordered by 2^(-usage/share) of the team times that of
  // the user, the usage decayed with this half-life (hours); 0: arrival order
  double fair_share_half_life_h = 0;
  // waste: a running lease reporting GPU utilisation below `waste_gpu_util_below` for at least
  // `waste_after_s` seconds is listed as waste (metrics, status page, report)
  double waste_gpu_util_below = 0.20;
  int waste_after_s = 3600;
  MemoryTable memory_table;

  int total_gpus() const { return static_cast<int>(gpus.size()); }
  // Node names in inventory order.
  std::vector<std::string> node_names() const;
  bool has_gpu_uuids() const;
  // Whole GPUs kept for critical leases.
  int emergency_pool_gpus() const;
  // The cap on a non-admin's critical request: emergency.max_gpus_per_request, else the emergency pool's size.
  int critical_gpus_cap() const;
  double max_gpu_memory_gib() const;
  bool needs_approval(const std::string& model) const;
  // The user whose current token, or previous token still within its `until` at `now_ms`, is `token`. Without a
  // time, a previous token with an `until` is refused (its end cannot be checked).
  const User* find_user_by_token(const std::string& token, int64_t now_ms = INT64_MAX) const;
  // Throws PolicyError naming the key if the policy is inconsistent.
  void validate() const;
};

// Loads a policy YAML; the memory table comes from `memory_table:` (relative to the policy file) or is empty.
// `tokens_path` (quotad reads $QUOTAD_TOKENS_FILE, the Secret the deployment mounts): a YAML file
// `users: {name: {token_sha256, token_salt?}}` whose hashes replace the policy's; every name must be a user of
// the policy, and a user without a hash in either file is an error.
Policy load_policy(const std::string& path, const std::string& tokens_path = "");
// Loads from text; `source` names it in errors; relative memory table paths resolve against `base_dir`.
Policy load_policy_from_string(const std::string& yaml, const std::string& source, const std::string& base_dir = ".",
                               const std::string& tokens_yaml = "", const std::string& tokens_source = "");
MemoryTable load_memory_table(const std::string& path);

// Embedded single-workstation policy: one team "local", `gpu_count` GPUs of `memory_gib`, user `user`
// as lead, no emergency pool, no credits, every model self-service.
Policy local_policy(int gpu_count, double memory_gib, const std::string& user);

// A DNS-1123 label (Kubernetes Namespace names): 1..63 of [a-z0-9-], alphanumeric at both ends.
bool is_dns1123_label(const std::string& name);
// quotad's rule for user names (also valid Kubernetes label values): 1..63 of [a-z0-9._-], alphanumeric at
// both ends.
bool is_valid_user_name(const std::string& name);
// 64 lowercase hex digits.
bool is_sha256_hex(const std::string& text);

// utc_offset_min (quota/core/calendar.h), or a PolicyError naming the zone: "UTC", "Z", "+HH:MM", "-HH:MM",
// "UTC+HH:MM".
int parse_utc_offset_min(const std::string& tz);

// What a reload of the policy would change, one clause per change ("team team-cv: base 8 -> 10", "user bob
// added", "user alice: token rotated"), for the audit log; "" when nothing a user or limit depends on changed.
std::string policy_change_summary(const Policy& before, const Policy& after);
// Why `after` cannot replace `before` in a running quotad (the inventory or the waste thresholds changed: held
// leases and the utilisation runs refer to them, so those need a restart); "" when it can.
std::string reload_refusal(const Policy& before, const Policy& after);

}  // namespace yolo8::quota
