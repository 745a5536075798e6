#include "quota/core/policy.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <set>
#include <sstream>
#include <type_traits>

#include "quota/core/sha256.h"

namespace yolo8::quota {

std::string to_string(Priority priority) {
  switch (priority) {
    case Priority::kLow: return "low";
    case Priority::kNormal: return "normal";
    case Priority::kHigh: return "high";
    case Priority::kCritical: return "critical";
  }
  return "normal";
}

Priority parse_priority(const std::string& text) {
  if (text == "low") return Priority::kLow;
  if (text == "normal" || text.empty()) return Priority::kNormal;
  if (text == "high") return Priority::kHigh;
  if (text == "critical") return Priority::kCritical;
  throw PolicyError("priority: '" + text + "' is not one of low, normal, high, critical");
}

int parse_utc_offset_min(const std::string& timezone) {
  if (const auto offset = utc_offset_min(timezone)) return *offset;
  throw PolicyError("time zone '" + timezone +
                    "' is not supported: use UTC or a fixed offset such as +01:00 (named zones are not supported)");
}

bool BurstWindow::contains(int64_t now_ms) const {
  return in_weekly_window(now_ms, utc_offset_min, weekdays, from_min, to_min);
}

bool Team::in_burst_window(int64_t now_ms) const {
  for (const auto& window : burst_windows) {
    if (window.contains(now_ms)) return true;
  }
  return false;
}

double Team::limit_at(int64_t now_ms) const { return in_burst_window(now_ms) ? burst : base; }

double MemoryTable::estimate_gib(const std::string& model, int imgsz, int batch_per_gpu) const {
  auto it = models.find(model);
  if (it == models.end()) return 0;
  const double scale = (static_cast<double>(imgsz) / 640.0) * (static_cast<double>(imgsz) / 640.0);
  return it->second.fixed_gib + it->second.per_image_gib * scale * batch_per_gpu;
}

namespace {
// "yolo8 profile, NVIDIA H200, float32, LibTorch 2.1.2, 2026-11-30": where a table's figures come from.
std::string table_origin(const MemoryTable& table) {
  std::string from = table.source.empty() ? "unknown source" : table.source;
  const MemoryProvenance& provenance = table.provenance;
  if (!provenance.device.empty()) from += ", " + provenance.device;
  if (!provenance.precision.empty()) from += ", " + provenance.precision;
  if (!provenance.libtorch.empty()) from += ", LibTorch " + provenance.libtorch;
  if (!provenance.date.empty()) from += ", " + provenance.date;
  return from;
}

std::string table_name(const MemoryTable& table) { return table.file.empty() ? std::string("(built in)") : table.file; }
}  // namespace

std::string MemoryTable::describe_row(const std::string& model) const {
  auto it = models.find(model);
  if (it == models.end()) return "";
  char figures[96];
  std::snprintf(figures, sizeof(figures), "%.3f GiB + %.4f GiB per image at 640", it->second.fixed_gib,
                it->second.per_image_gib);
  return "memory table " + table_name(*this) + " row " + model + ": " + figures + " (" + table_origin(*this) + ")";
}

int MemoryTable::max_batch(const std::string& model, int imgsz, double memory_gib) const {
  auto it = models.find(model);
  if (it == models.end()) return 0;
  const double scale = (static_cast<double>(imgsz) / 640.0) * (static_cast<double>(imgsz) / 640.0);
  const double per = it->second.per_image_gib * scale;
  const double room = memory_gib - it->second.fixed_gib;
  if (room <= 0 || per <= 0) return 0;
  return static_cast<int>(std::floor(room / per + 1e-9));
}

int Policy::emergency_pool_gpus() const {
  return static_cast<int>(std::ceil(emergency_pool_fraction * total_gpus() - 1e-9));
}

int Policy::critical_gpus_cap() const {
  return emergency_max_gpus_per_request >= 0 ? emergency_max_gpus_per_request : emergency_pool_gpus();
}

std::vector<std::string> Policy::node_names() const {
  std::vector<std::string> names;
  for (const auto& gpu : gpus) {
    if (std::find(names.begin(), names.end(), gpu.node) == names.end()) names.push_back(gpu.node);
  }
  return names;
}

bool Policy::has_gpu_uuids() const {
  return std::any_of(gpus.begin(), gpus.end(), [](const Gpu& gpu) { return !gpu.uuid.empty(); });
}

double Policy::shared_overhead_gib() const {
  return memory_table.process_overhead_gib >= 0 ? memory_table.process_overhead_gib : process_overhead_gib;
}

std::string Policy::describe_shared_overhead() const {
  char figure[48];
  std::snprintf(figure, sizeof(figure), "%.2f GiB per process", shared_overhead_gib());
  if (memory_table.process_overhead_gib >= 0) {
    return std::string(figure) + " (measured: memory table " + table_name(memory_table) + " process_overhead_gib, " +
           table_origin(memory_table) + ")";
  }
  return std::string(figure) + " (sharing.process_overhead_gib" +
         (key_lines.count("sharing.process_overhead_gib") ? "" : ", a default until measured on the GPU") + ")";
}

double Policy::max_gpu_memory_gib() const {
  double largest = 0;
  for (const auto& gpu : gpus) largest = std::max(largest, gpu.memory_gib);
  return largest;
}

std::string Policy::shared_refusal(const std::string& model, int lease_gpus) const {
  if (!sharing_enabled) return "shared: this policy does not share GPUs (sharing.enabled is false)";
  if (lease_gpus > 1) return "shared: a shared lease is a part of one GPU; ask for gpus=1 or a whole-GPU lease";
  if (!shared_models.empty() && std::find(shared_models.begin(), shared_models.end(), model) == shared_models.end()) {
    std::string allowed;
    for (const auto& name : shared_models) allowed += (allowed.empty() ? "" : ", ") + name;
    return "shared: model " + model + " needs whole GPUs; only " + allowed + " may share one (sharing.models)";
  }
  return "";
}

bool Policy::needs_approval(const std::string& model) const {
  auto in = [&](const std::vector<std::string>& models) {
    return std::find(models.begin(), models.end(), model) != models.end();
  };
  if (in(self_service_models)) return false;
  if (in(approval_models)) return true;
  return unknown_models_need_approval;
}

const User* Policy::find_user_by_token(const std::string& token, int64_t now_ms) const {
  if (token.empty()) return nullptr;
  // Every user's hash is computed and compared in full, whatever matches, so the time taken says nothing
  // about which user or how many leading digits matched.
  const User* found = nullptr;
  const std::string unsalted = sha256_hex(token);
  for (const auto& [name, user] : users) {
    const std::string token_hash = user.token_salt.empty() ? unsalted : sha256_hex(user.token_salt + token);
    if (digests_equal(token_hash, user.token_sha256) && found == nullptr) found = &user;
    if (user.previous_token_sha256.empty()) continue;
    const std::string previous_hash =
        user.previous_token_salt.empty() ? unsalted : sha256_hex(user.previous_token_salt + token);
    const bool in_time = user.previous_token_until_ms == 0 || now_ms < user.previous_token_until_ms;
    if (digests_equal(previous_hash, user.previous_token_sha256) && in_time && found == nullptr) found = &user;
  }
  return found;
}

std::string lower_case(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  return text;
}

namespace {
// 8-4-4-4-12 hex digits from `at`; the position after it, or npos.
size_t skip_uuid(const std::string& text, size_t at) {
  for (const int group : {8, 4, 4, 4, 12}) {
    for (int i = 0; i < group; ++i, ++at) {
      if (at >= text.size() || !std::isxdigit(static_cast<unsigned char>(text[at]))) return std::string::npos;
    }
    if (group != 12) {
      if (at >= text.size() || text[at] != '-') return std::string::npos;
      ++at;
    }
  }
  return at;
}
// "/<digits>" from `at`; the position after it, or npos.
size_t skip_slash_number(const std::string& text, size_t at) {
  if (at >= text.size() || text[at] != '/') return std::string::npos;
  const size_t first = ++at;
  while (at < text.size() && std::isdigit(static_cast<unsigned char>(text[at]))) ++at;
  return at == first ? std::string::npos : at;
}
}  // namespace

bool is_gpu_uuid(const std::string& text) {
  if (text.rfind("GPU-", 0) == 0) return skip_uuid(text, 4) == text.size();
  if (text.rfind("MIG-GPU-", 0) == 0) {
    size_t at = skip_uuid(text, 8);
    if (at != std::string::npos) at = skip_slash_number(text, at);
    if (at != std::string::npos) at = skip_slash_number(text, at);
    return at == text.size();
  }
  if (text.rfind("MIG-", 0) == 0) return skip_uuid(text, 4) == text.size();
  return false;
}

bool is_dns1123_label(const std::string& name) {
  if (name.empty() || name.size() > 63) return false;
  auto alnum = [](char ch) { return (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9'); };
  for (char ch : name) {
    if (!alnum(ch) && ch != '-') return false;
  }
  return alnum(name.front()) && alnum(name.back());
}

bool is_valid_user_name(const std::string& name) {
  if (name.empty() || name.size() > 63) return false;
  auto alnum = [](char ch) { return (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9'); };
  for (char ch : name) {
    if (!alnum(ch) && ch != '-' && ch != '_' && ch != '.') return false;
  }
  return alnum(name.front()) && alnum(name.back());
}

bool is_sha256_hex(const std::string& text) {
  if (text.size() != 64) return false;
  for (char ch : text) {
    if (!((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f'))) return false;
  }
  return true;
}

void Policy::validate() const {
  const std::string where = source.empty() ? "policy" : source;
  // the line of `key`, or of the nearest enclosing key the file defined
  auto line_of = [&](std::string key) {
    while (!key.empty()) {
      if (auto it = key_lines.find(key); it != key_lines.end()) return it->second;
      const auto cut = key.find_last_of(".[");
      key = cut == std::string::npos ? "" : key.substr(0, cut);
    }
    return 0;
  };
  auto fail = [&](const std::string& key, const std::string& msg) {
    const int line = line_of(key);
    throw PolicyError(where + (line > 0 ? ":" + std::to_string(line) : "") + ": " + key + ": " + msg);
  };
  // NaN compares false with everything, so every range check below is written as !(within range)
  auto finite_at_least = [&](double value, double low, const std::string& key) {
    if (!std::isfinite(value)) fail(key, "must be a finite number");
    if (!(value >= low)) fail(key, "must be >= " + std::to_string(static_cast<long long>(low)));
  };
  if (gpus.empty()) fail("inventory", "no GPUs listed");
  // GPU UUIDs: one per GPU, each a UUID, none twice (quotad matches the trainer's visible GPUs against them)
  std::map<std::string, std::string> uuid_keys;  // lower-case UUID -> key that listed it
  for (size_t i = 0; i < nodes.size(); ++i) {
    const InventoryNode& node = nodes[i];
    const std::string key = "inventory.nodes[" + std::to_string(i) + "].uuids";
    if (node.uuids.empty()) continue;
    if (node.uuids.size() != static_cast<size_t>(node.gpus)) {
      fail(key, "lists " + std::to_string(node.uuids.size()) + " UUIDs for the " + std::to_string(node.gpus) +
                    " GPUs of node " + node.name + ": one per GPU, in index order (nvidia-smi -L)");
    }
    for (size_t j = 0; j < node.uuids.size(); ++j) {
      const std::string uuid_key = key + "[" + std::to_string(j) + "]";
      if (!is_gpu_uuid(node.uuids[j])) {
        fail(uuid_key, "'" + node.uuids[j] +
                           "' is not a GPU UUID: GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx or MIG-..., as nvidia-smi -L "
                           "prints it");
      }
      const auto [it, fresh] = uuid_keys.emplace(lower_case(node.uuids[j]), uuid_key);
      if (!fresh) fail(uuid_key, "'" + node.uuids[j] + "' is listed twice (also " + it->second + ")");
    }
  }
  for (const auto& gpu : gpus) {
    if (gpu.uuid.empty()) continue;
    // a policy built in code has no `nodes`: its GPUs' UUIDs are checked here
    if (!is_gpu_uuid(gpu.uuid)) fail("inventory." + gpu.node + ".uuids", "'" + gpu.uuid + "' is not a GPU UUID");
    if (nodes.empty() && !uuid_keys.emplace(lower_case(gpu.uuid), gpu.id()).second) {
      fail("inventory." + gpu.node + ".uuids", "'" + gpu.uuid + "' is listed twice");
    }
  }
  for (const auto& gpu : gpus) {
    if (!std::isfinite(gpu.memory_gib) || !(gpu.memory_gib > 0)) {
      fail("inventory." + gpu.node + ".memory_gib", "must be a finite number > 0");
    }
  }
  if (!(emergency_pool_fraction >= 0 && emergency_pool_fraction <= 0.5)) {
    fail("emergency_pool", "fraction must be within [0, 0.5] (the department uses 0.15-0.20)");
  }
  if (default_gpus < 1) fail("defaults.gpus", "must be >= 1");
  if (!std::isfinite(default_memory_fallback_gib) || !(default_memory_fallback_gib > 0)) {
    fail("defaults.memory_gib_other", "must be a finite number > 0");
  }
  for (const auto& [model, gib] : default_memory_gib) {
    if (!std::isfinite(gib) || !(gib > 0)) fail("defaults.memory_gib." + model, "must be a finite number > 0");
  }
  if (ttl_s <= 0) fail("leases.ttl_s", "must be > 0");
  if (heartbeat_interval_s <= 0 || heartbeat_interval_s >= ttl_s) {
    fail("leases.heartbeat_interval_s", "must be > 0 and below ttl_s");
  }
  if (expiry_grace_s < 0) fail("leases.expiry_grace_s", "must be >= 0");
  if (emergency_max_gpus_per_request < -1 || emergency_max_gpus_per_request > total_gpus()) {
    fail("emergency.max_gpus_per_request", "must be within 0.." + std::to_string(total_gpus()) + " (the inventory)");
  }
  if (min_runtime_s < 0) fail("preemption.min_runtime_s", "must be >= 0");
  if (preempt_grace_s < 0) fail("preemption.grace_s", "must be >= 0");
  if (max_leases_per_gpu < 1) fail("sharing.max_leases_per_gpu", "must be >= 1");
  finite_at_least(process_overhead_gib, 0, "sharing.process_overhead_gib");
  // -1 stands for "the table does not say"; the loader refuses every negative number in the file
  if (memory_table.process_overhead_gib != -1) {
    finite_at_least(memory_table.process_overhead_gib, 0, "memory_table.process_overhead_gib");
  }
  finite_at_least(monthly_gpu_hours, 0, "credits.monthly_gpu_hours");
  finite_at_least(loan_gpu_hours, 0, "credits.loan_gpu_hours");
  if (loan_applications_per_month < 0) fail("credits.loan_applications_per_month", "must be >= 0 (0: no applications)");
  finite_at_least(max_loan_gpu_hours_per_month, 0, "credits.max_loan_gpu_hours_per_month");
  finite_at_least(max_grant_gpu_hours_per_quarter, 0, "credits.max_grant_gpu_hours_per_quarter");
  if (max_batch < 1) fail("limits.max_batch", "must be >= 1");
  if (max_imgsz < 32) fail("limits.max_imgsz", "must be >= 32");
  if (max_queued_per_user < 1) fail("limits.max_queued_per_user", "must be >= 1");
  if (!(waste_gpu_util_below >= 0 && waste_gpu_util_below <= 1)) fail("waste.gpu_util_below", "must be within [0, 1]");
  if (waste_after_s < 0) fail("waste.after_s", "must be >= 0");
  finite_at_least(fair_share_half_life_h, 0, "fair_share.half_life_h");
  for (const auto& [model, estimate] : memory_table.models) {
    if (!std::isfinite(estimate.fixed_gib) || !std::isfinite(estimate.per_image_gib) || estimate.fixed_gib < 0 ||
        !(estimate.per_image_gib > 0)) {
      fail("memory_table.models." + model, "values must be finite and positive");
    }
  }
  double base_sum = 0;
  for (const auto& [name, team] : teams) {
    const std::string team_key = "teams." + name;
    if (!is_dns1123_label(name)) {
      fail(team_key, "'" + name +
                         "' is not a valid team name: it becomes a Kubernetes Namespace, so 1-63 characters of "
                         "a-z, 0-9 and '-', starting and ending with a letter or digit");
    }
    finite_at_least(team.base, 0, team_key + ".base");
    if (!std::isfinite(team.burst)) fail(team_key + ".burst", "must be a finite number");
    if (!(team.burst >= team.base)) fail(team_key + ".burst", "must be >= base");
    if (team.burst > total_gpus()) {
      fail(team_key + ".burst", "exceeds the inventory of " + std::to_string(total_gpus()) + " GPUs");
    }
    if (key_lines.count(team_key + ".share") || team.share != -1) finite_at_least(team.share, 0, team_key + ".share");
    if (team.max_gpus_per_user < 0) fail(team_key + ".max_gpus_per_user", "must be >= 0 (0: no cap)");
    if (team.max_gpus_per_user > total_gpus()) {
      fail(team_key + ".max_gpus_per_user", "exceeds the inventory of " + std::to_string(total_gpus()) + " GPUs");
    }
    base_sum += team.base;
    for (const auto& user : team.leads) {
      if (!users.count(user)) fail(team_key + ".leads", "unknown user '" + user + "'");
    }
    for (const auto& user : team.members) {
      if (!users.count(user)) fail(team_key + ".members", "unknown user '" + user + "'");
    }
  }
  if (base_sum > total_gpus() - emergency_pool_gpus() + 1e-9) {
    fail("teams", "the sum of base GPUs exceeds the inventory minus the emergency pool");
  }
  std::map<std::string, std::string> hashes;  // hash -> user
  for (const auto& [name, user] : users) {
    const std::string user_key = "users." + name;
    if (user.token_sha256.empty()) {
      fail(user_key + ".token_sha256", "no token hash: set it here or in the tokens file ($QUOTAD_TOKENS_FILE)");
    }
    if (!is_sha256_hex(user.token_sha256))
      fail(user_key + ".token_sha256", "must be 64 hex digits (quotad hash-token)");
    for (char ch : user.token_salt) {
      if (!std::isxdigit(static_cast<unsigned char>(ch))) fail(user_key + ".token_salt", "must be hex digits");
    }
    const auto [it, fresh] = hashes.emplace(user.token_salt + "$" + user.token_sha256, name);
    if (!fresh) fail(user_key + ".token_sha256", "duplicate token (also used by " + it->second + ")");
    if (!user.previous_token_sha256.empty()) {
      if (!is_sha256_hex(user.previous_token_sha256)) {
        fail(user_key + ".previous_token_sha256", "must be 64 hex digits (quotad hash-token)");
      }
      for (char ch : user.previous_token_salt) {
        if (!std::isxdigit(static_cast<unsigned char>(ch))) {
          fail(user_key + ".previous_token_salt", "must be hex digits");
        }
      }
      const auto [other, unused] = hashes.emplace(user.previous_token_salt + "$" + user.previous_token_sha256, name);
      if (!unused) {
        fail(user_key + ".previous_token_sha256", other->second == name
                                                      ? "the same token as token_sha256: rotate to a new one"
                                                      : "duplicate token (also used by " + other->second + ")");
      }
    } else if (!user.previous_token_salt.empty() || user.previous_token_until_ms != 0) {
      fail(user_key + ".previous_token_sha256", "required with previous_token_salt or previous_token_until");
    }
    if (user.role != Role::kAdmin && !teams.count(user.team)) fail(user_key, "belongs to no team");
  }
}

// ---- YAML loading ----
namespace {

struct YamlContext {
  std::string source;
  [[noreturn]] void fail(const YAML::Node& node, const std::string& key, const std::string& msg) const {
    std::ostringstream stream;
    stream << source;
    if (node.IsDefined() && node.Mark().line >= 0) stream << ":" << (node.Mark().line + 1);
    stream << ": " << key << ": " << msg;
    throw PolicyError(stream.str());
  }
  void keys(const YAML::Node& node, const std::string& key, std::initializer_list<const char*> allowed) const {
    if (!node.IsMap()) fail(node, key.empty() ? "(top level)" : key, "must be a mapping");
    for (const auto& entry : node) {
      const std::string entry_key = entry.first.as<std::string>();
      bool ok = false;
      for (const char* allowed_key : allowed) ok = ok || entry_key == allowed_key;
      if (!ok) fail(entry.first, key.empty() ? entry_key : key + "." + entry_key, "unknown key");
    }
  }
  template <typename T>
  T get(const YAML::Node& node, const std::string& key, T fallback) const {
    if (!node.IsDefined() || node.IsNull()) return fallback;
    // yaml-cpp reads "yes" or "true" in quotes as a boolean: a quoted string is text, not a switch.
    if constexpr (std::is_same_v<T, bool>) {
      if (node.IsScalar() && node.Tag() == "!") fail(node, key, "must be true or false, not a quoted string");
    }
    T value{};
    try {
      value = node.as<T>();
    } catch (const YAML::Exception&) {
      fail(node, key, "has the wrong type");
    }
    if constexpr (std::is_floating_point_v<T>) {
      if (!std::isfinite(value)) fail(node, key, "must be a finite number (not .nan or .inf)");
    }
    return value;
  }
  template <typename T>
  T need(const YAML::Node& parent, const char* name, const std::string& key) const {
    const YAML::Node node = parent[name];
    if (!node.IsDefined() || node.IsNull()) fail(parent, key, "is required");
    return get<T>(node, key, T{});
  }
};

// Records the line of every key path and refuses a key that appears twice in one mapping (yaml-cpp keeps both
// entries and lookups see only the first, so a duplicate would silently drop a team or a user).
void index_keys(const YamlContext& context, const YAML::Node& node, const std::string& path,
                std::map<std::string, int>& lines) {
  if (node.IsMap()) {
    std::map<std::string, int> seen;
    for (const auto& entry : node) {
      if (!entry.first.IsScalar()) continue;  // the loader names a non-scalar key where it reads it
      const std::string key = entry.first.Scalar();
      const std::string key_path = path.empty() ? key : path + "." + key;
      const int line = entry.first.Mark().line + 1;
      const auto [it, fresh] = seen.emplace(key, line);
      if (!fresh) {
        context.fail(entry.first, key_path,
                     "duplicate key (lines " + std::to_string(it->second) + " and " + std::to_string(line) + ")");
      }
      lines[key_path] = line;
      index_keys(context, entry.second, key_path, lines);
    }
  } else if (node.IsSequence()) {
    for (size_t i = 0; i < node.size(); ++i) {
      const std::string key_path = path + "[" + std::to_string(i) + "]";
      if (node[i].Mark().line >= 0) lines[key_path] = node[i].Mark().line + 1;
      index_keys(context, node[i], key_path, lines);
    }
  }
}

int parse_hhmm(const YamlContext& context, const YAML::Node& node, const std::string& key) {
  const std::string text = context.get<std::string>(node, key, "");
  int hours = -1, minutes = -1;
  char extra = 0;
  if (std::sscanf(text.c_str(), "%2d:%2d%c", &hours, &minutes, &extra) != 2 || hours < 0 || hours > 24 || minutes < 0 ||
      minutes > 59 || (hours == 24 && minutes != 0)) {
    context.fail(node, key, "'" + text + "' is not HH:MM");
  }
  return hours * 60 + minutes;
}

int parse_weekday(const YamlContext& context, const YAML::Node& node, const std::string& key) {
  static const char* kDays[] = {"mon", "tue", "wed", "thu", "fri", "sat", "sun"};
  std::string text = context.get<std::string>(node, key, "");
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  for (int i = 0; i < 7; ++i) {
    if (text.substr(0, 3) == kDays[i]) return i;
  }
  context.fail(node, key, "'" + text + "' is not a weekday (mon..sun)");
}

std::vector<std::string> string_list(const YamlContext& context, const YAML::Node& node, const std::string& key) {
  std::vector<std::string> out;
  if (!node.IsDefined() || node.IsNull()) return out;
  if (!node.IsSequence()) context.fail(node, key, "must be a list");
  for (size_t i = 0; i < node.size(); ++i) out.push_back(context.get<std::string>(node[i], key, ""));
  return out;
}

MemoryTable parse_memory_table(const YamlContext& context, const YAML::Node& root) {
  MemoryTable table;
  context.keys(root, "", {"models", "reference_imgsz", "note", "source", "provenance", "process_overhead_gib"});
  table.file = context.source;
  if (root["source"].IsDefined()) table.source = context.get<std::string>(root["source"], "source", "");
  if (const YAML::Node overhead = root["process_overhead_gib"]; overhead.IsDefined()) {
    table.process_overhead_gib = context.need<double>(root, "process_overhead_gib", "process_overhead_gib");
    if (!(table.process_overhead_gib >= 0)) context.fail(overhead, "process_overhead_gib", "must be >= 0");
  }
  if (const YAML::Node from = root["provenance"]; from.IsDefined()) {
    context.keys(from, "provenance", {"device", "precision", "libtorch", "date"});
    table.provenance.device = context.get<std::string>(from["device"], "provenance.device", "");
    table.provenance.precision = context.get<std::string>(from["precision"], "provenance.precision", "");
    table.provenance.libtorch = context.get<std::string>(from["libtorch"], "provenance.libtorch", "");
    table.provenance.date = context.get<std::string>(from["date"], "provenance.date", "");
    if (!table.provenance.precision.empty() && table.provenance.precision != "amp" &&
        table.provenance.precision != "amp_bfloat16" && table.provenance.precision != "float32") {
      // amp: float16 autocast (the trainer's default); amp_bfloat16: amp_dtype=bfloat16
      context.fail(from["precision"], "provenance.precision", "must be amp, amp_bfloat16 or float32");
    }
    const std::string& date = table.provenance.date;
    const bool date_ok = date.empty() || (date.size() == 10 && date[4] == '-' && date[7] == '-' &&
                                          std::all_of(date.begin(), date.end(), [](char c) {
                                            return c == '-' || std::isdigit(static_cast<unsigned char>(c));
                                          }));
    if (!date_ok) context.fail(from["date"], "provenance.date", "must be a date YYYY-MM-DD");
  }
  if (root["reference_imgsz"].IsDefined() && context.get<int>(root["reference_imgsz"], "reference_imgsz", 640) != 640) {
    context.fail(root["reference_imgsz"], "reference_imgsz", "only 640 is supported");
  }
  const YAML::Node models = root["models"];
  if (!models.IsMap()) context.fail(root, "models", "must be a mapping of model -> {fixed_gib, per_image_gib}");
  for (const auto& entry : models) {
    const std::string name = entry.first.as<std::string>();
    const std::string key_path = "models." + name;
    context.keys(entry.second, key_path, {"fixed_gib", "per_image_gib"});
    MemoryEstimate estimate;
    estimate.fixed_gib = context.need<double>(entry.second, "fixed_gib", key_path + ".fixed_gib");
    estimate.per_image_gib = context.need<double>(entry.second, "per_image_gib", key_path + ".per_image_gib");
    if (estimate.fixed_gib < 0 || estimate.per_image_gib <= 0) {
      context.fail(entry.second, key_path, "values must be positive");
    }
    table.models[name] = estimate;
  }
  return table;
}

YAML::Node parse_yaml(const std::string& text, const std::string& source) {
  try {
    return YAML::Load(text);
  } catch (const YAML::ParserException& error) {
    throw PolicyError(source + ":" + std::to_string(error.mark.line + 1) + ": YAML syntax error: " + error.msg);
  }
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw PolicyError(path + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

MemoryTable load_memory_table(const std::string& path) {
  YamlContext context{path};
  try {
    return parse_memory_table(context, parse_yaml(read_file(path), path));
  } catch (const YAML::Exception& error) {
    throw PolicyError(path + ":" + std::to_string(error.mark.line + 1) + ": " + error.msg);
  }
}

namespace {
Policy parse_policy(const std::string& yaml, const std::string& source, const std::string& base_dir,
                    const std::string& tokens_yaml, const std::string& tokens_source);
}  // namespace

Policy load_policy_from_string(const std::string& yaml, const std::string& source, const std::string& base_dir,
                               const std::string& tokens_yaml, const std::string& tokens_source) {
  try {
    return parse_policy(yaml, source, base_dir, tokens_yaml, tokens_source);
  } catch (const YAML::Exception& error) {
    // e.g. a mapping used as a key: still name the place
    throw PolicyError(source + ":" + std::to_string(error.mark.line + 1) + ": " + error.msg);
  }
}

namespace {
// previous_token_sha256 / previous_token_salt / previous_token_until of a user (the policy's or the tokens file's):
// the token being rotated out, see User.
void read_previous_token(const YamlContext& context, const YAML::Node& node, const std::string& key_path, User& user) {
  auto lower = [](std::string text) {
    std::transform(text.begin(), text.end(), text.begin(),
                   [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
    return text;
  };
  user.previous_token_sha256 =
      lower(context.get<std::string>(node["previous_token_sha256"], key_path + ".previous_token_sha256", ""));
  user.previous_token_salt =
      lower(context.get<std::string>(node["previous_token_salt"], key_path + ".previous_token_salt", ""));
  user.previous_token_until_ms = 0;
  const std::string until =
      context.get<std::string>(node["previous_token_until"], key_path + ".previous_token_until", "");
  if (until.empty()) return;
  std::tm tm{};
  const char* end = strptime(until.c_str(), "%Y-%m-%dT%H:%M:%SZ", &tm);
  if (end == nullptr || *end != '\0') {
    context.fail(node["previous_token_until"], key_path + ".previous_token_until",
                 "'" + until + "' is not a UTC time of the form 2026-12-31T18:00:00Z");
  }
  user.previous_token_until_ms = static_cast<int64_t>(timegm(&tm)) * 1000;
}

// The token Secret's hashes over the policy's (see load_policy).
void merge_tokens(Policy& policy, const std::string& yaml, const std::string& source) {
  YamlContext context{source};
  const YAML::Node root = parse_yaml(yaml, source);
  std::map<std::string, int> lines;
  index_keys(context, root, "", lines);
  context.keys(root, "", {"users"});
  const YAML::Node users = root["users"];
  if (!users.IsMap()) context.fail(root, "users", "must be a mapping of name -> {token_sha256, token_salt}");
  for (const auto& entry : users) {
    const std::string name = entry.first.as<std::string>();
    const std::string key_path = "users." + name;
    context.keys(
        entry.second, key_path,
        {"token_sha256", "token_salt", "previous_token_sha256", "previous_token_salt", "previous_token_until"});
    auto it = policy.users.find(name);
    if (it == policy.users.end()) context.fail(entry.first, key_path, "not a user of the policy " + policy.source);
    auto lower = [](std::string text) {
      std::transform(text.begin(), text.end(), text.begin(),
                     [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
      return text;
    };
    it->second.token_sha256 =
        lower(context.need<std::string>(entry.second, "token_sha256", key_path + ".token_sha256"));
    it->second.token_salt = lower(context.get<std::string>(entry.second["token_salt"], key_path + ".token_salt", ""));
    if (!is_sha256_hex(it->second.token_sha256)) {
      context.fail(entry.second, key_path + ".token_sha256", "must be 64 hex digits (quotad hash-token)");
    }
    read_previous_token(context, entry.second, key_path, it->second);
  }
}

Policy parse_policy(const std::string& yaml, const std::string& source, const std::string& base_dir,
                    const std::string& tokens_yaml, const std::string& tokens_source) {
  YamlContext context{source};
  const YAML::Node root = parse_yaml(yaml, source);
  Policy policy;
  policy.source = source;
  index_keys(context, root, "", policy.key_lines);
  context.keys(root, "",
               {"inventory", "teams", "users", "emergency_pool", "emergency", "defaults", "tiers", "leases",
                "preemption", "sharing", "credits", "memory_table", "limits", "waste", "fair_share"});
  // inventory
  const YAML::Node inv = root["inventory"];
  if (!inv.IsDefined()) context.fail(root, "inventory", "is required");
  context.keys(inv, "inventory", {"nodes"});
  const YAML::Node nodes = inv["nodes"];
  if (!nodes.IsSequence() || nodes.size() == 0) context.fail(inv, "inventory.nodes", "must be a non-empty list");
  std::set<std::string> node_names;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const std::string key_path = "inventory.nodes[" + std::to_string(i) + "]";
    context.keys(nodes[i], key_path, {"name", "gpus", "memory_gib", "uuids"});
    const std::string name = context.need<std::string>(nodes[i], "name", key_path + ".name");
    if (!node_names.insert(name).second) context.fail(nodes[i], key_path + ".name", "duplicate node '" + name + "'");
    const int count = context.need<int>(nodes[i], "gpus", key_path + ".gpus");
    const double mem = context.need<double>(nodes[i], "memory_gib", key_path + ".memory_gib");
    if (count < 1 || count > 64) context.fail(nodes[i]["gpus"], key_path + ".gpus", "must be within 1..64");
    if (!(mem > 0)) context.fail(nodes[i]["memory_gib"], key_path + ".memory_gib", "must be > 0");
    InventoryNode listed{name, count, mem, string_list(context, nodes[i]["uuids"], key_path + ".uuids")};
    for (int gpu_index = 0; gpu_index < count; ++gpu_index) {
      // a count that does not match is named by validate()
      const bool matched = listed.uuids.size() == static_cast<size_t>(count);
      policy.gpus.push_back(Gpu{name, gpu_index, mem, matched ? listed.uuids[static_cast<size_t>(gpu_index)] : ""});
    }
    policy.nodes.push_back(std::move(listed));
  }
  policy.emergency_pool_fraction = context.get<double>(root["emergency_pool"], "emergency_pool", 0.15);
  // users
  const YAML::Node users = root["users"];
  std::map<std::string, YAML::Node> user_nodes;
  if (users.IsDefined() && !users.IsNull()) {
    if (!users.IsMap()) context.fail(users, "users", "must be a mapping of name -> {token_sha256, role}");
    for (const auto& entry : users) user_nodes[entry.first.as<std::string>()] = entry.second;
  }
  for (const auto& [name, node] : user_nodes) {
    const std::string key_path = "users." + name;
    context.keys(
        node, key_path,
        {"token_sha256", "token_salt", "previous_token_sha256", "previous_token_salt", "previous_token_until", "role"});
    if (!is_valid_user_name(name)) {
      context.fail(node, key_path,
                   "'" + name +
                       "' is not a valid user name: 1-63 characters of a-z, 0-9, '.', '_' and '-', "
                       "starting and ending with a letter or digit");
    }
    User user;
    user.name = name;
    auto lower = [](std::string text) {
      std::transform(text.begin(), text.end(), text.begin(),
                     [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
      return text;
    };
    // may come from the tokens file instead (validate() insists on one)
    user.token_sha256 = lower(context.get<std::string>(node["token_sha256"], key_path + ".token_sha256", ""));
    user.token_salt = lower(context.get<std::string>(node["token_salt"], key_path + ".token_salt", ""));
    read_previous_token(context, node, key_path, user);
    const std::string role = context.get<std::string>(node["role"], key_path + ".role", "member");
    if (role == "admin") {
      user.role = Role::kAdmin;
    } else if (role != "member") {
      context.fail(node["role"], key_path + ".role",
                   "'" + role + "' is not member or admin (leads are listed under their team)");
    }
    policy.users[name] = user;
  }
  // teams
  const YAML::Node teams = root["teams"];
  if (!teams.IsMap() || teams.size() == 0) context.fail(root, "teams", "must be a non-empty mapping");
  for (const auto& entry : teams) {
    Team team;
    team.name = entry.first.as<std::string>();
    const std::string key_path = "teams." + team.name;
    const YAML::Node node = entry.second;
    context.keys(node, key_path, {"base", "burst", "burst_windows", "leads", "members", "share", "max_gpus_per_user"});
    team.base = context.need<double>(node, "base", key_path + ".base");
    team.burst = context.get<double>(node["burst"], key_path + ".burst", team.base);
    team.share = context.get<double>(node["share"], key_path + ".share", -1);
    team.max_gpus_per_user = context.get<int>(node["max_gpus_per_user"], key_path + ".max_gpus_per_user", 0);
    team.leads = string_list(context, node["leads"], key_path + ".leads");
    team.members = string_list(context, node["members"], key_path + ".members");
    const YAML::Node wins = node["burst_windows"];
    if (wins.IsDefined() && !wins.IsNull()) {
      if (!wins.IsSequence()) context.fail(wins, key_path + ".burst_windows", "must be a list");
      for (size_t i = 0; i < wins.size(); ++i) {
        const std::string window_key = key_path + ".burst_windows[" + std::to_string(i) + "]";
        context.keys(wins[i], window_key, {"days", "from", "to", "timezone"});
        BurstWindow window;
        const YAML::Node days = wins[i]["days"];
        if (!days.IsSequence() || days.size() == 0) {
          context.fail(wins[i], window_key + ".days", "must be a non-empty list");
        }
        for (size_t day_index = 0; day_index < days.size(); ++day_index) {
          window.weekdays.push_back(parse_weekday(context, days[day_index], window_key + ".days"));
        }
        if (!wins[i]["from"].IsDefined()) context.fail(wins[i], window_key + ".from", "is required");
        if (!wins[i]["to"].IsDefined()) context.fail(wins[i], window_key + ".to", "is required");
        window.from_min = parse_hhmm(context, wins[i]["from"], window_key + ".from");
        window.to_min = parse_hhmm(context, wins[i]["to"], window_key + ".to");
        if (window.from_min == window.to_min) context.fail(wins[i], window_key, "from and to are equal");
        window.timezone = context.get<std::string>(wins[i]["timezone"], window_key + ".timezone", "UTC");
        try {
          window.utc_offset_min = parse_utc_offset_min(window.timezone);
        } catch (const PolicyError& error) {
          context.fail(wins[i]["timezone"], window_key + ".timezone", error.what());
        }
        team.burst_windows.push_back(window);
      }
    }
    for (const auto& lead : team.leads) {
      auto it = policy.users.find(lead);
      if (it == policy.users.end()) context.fail(node["leads"], key_path + ".leads", "unknown user '" + lead + "'");
      if (!it->second.team.empty() && it->second.team != team.name) {
        context.fail(node["leads"], key_path + ".leads",
                     "user '" + lead + "' already belongs to team " + it->second.team);
      }
      it->second.team = team.name;
      if (it->second.role != Role::kAdmin) it->second.role = Role::kLead;
    }
    for (const auto& member_name : team.members) {
      auto it = policy.users.find(member_name);
      if (it == policy.users.end()) {
        context.fail(node["members"], key_path + ".members", "unknown user '" + member_name + "'");
      }
      if (!it->second.team.empty() && it->second.team != team.name) {
        context.fail(node["members"], key_path + ".members",
                     "user '" + member_name + "' already belongs to team " + it->second.team);
      }
      it->second.team = team.name;
    }
    policy.teams[team.name] = team;
  }
  // defaults
  if (const YAML::Node section = root["defaults"]; section.IsDefined()) {
    context.keys(section, "defaults", {"gpus", "memory_gib", "memory_gib_other"});
    policy.default_gpus = context.get<int>(section["gpus"], "defaults.gpus", 1);
    if (const YAML::Node per_model = section["memory_gib"]; per_model.IsDefined()) {
      if (!per_model.IsMap()) context.fail(per_model, "defaults.memory_gib", "must be a mapping of model -> GiB");
      for (const auto& entry : per_model) {
        policy.default_memory_gib[entry.first.as<std::string>()] =
            context.get<double>(entry.second, "defaults.memory_gib." + entry.first.as<std::string>(), 0);
      }
    }
    policy.default_memory_fallback_gib =
        context.get<double>(section["memory_gib_other"], "defaults.memory_gib_other", 8);
  }
  if (const YAML::Node section = root["tiers"]; section.IsDefined()) {
    context.keys(section, "tiers", {"self_service", "approval", "custom_models_need_approval"});
    if (section["self_service"].IsDefined()) {
      policy.self_service_models = string_list(context, section["self_service"], "tiers.self_service");
    }
    if (section["approval"].IsDefined()) {
      policy.approval_models = string_list(context, section["approval"], "tiers.approval");
    }
    policy.unknown_models_need_approval =
        context.get<bool>(section["custom_models_need_approval"], "tiers.custom_models_need_approval", true);
  }
  if (const YAML::Node section = root["leases"]; section.IsDefined()) {
    context.keys(section, "leases", {"ttl_s", "heartbeat_interval_s", "expiry_grace_s"});
    policy.ttl_s = context.get<int>(section["ttl_s"], "leases.ttl_s", policy.ttl_s);
    policy.heartbeat_interval_s =
        context.get<int>(section["heartbeat_interval_s"], "leases.heartbeat_interval_s", policy.heartbeat_interval_s);
    policy.expiry_grace_s = context.get<int>(section["expiry_grace_s"], "leases.expiry_grace_s", policy.expiry_grace_s);
  }
  if (const YAML::Node section = root["emergency"]; section.IsDefined()) {
    context.keys(section, "emergency", {"max_gpus_per_request"});
    if (section["max_gpus_per_request"].IsDefined()) {
      policy.emergency_max_gpus_per_request =
          context.need<int>(section, "max_gpus_per_request", "emergency.max_gpus_per_request");
      // -1 stands for "absent" in the struct; in the file every negative number is an error
      if (policy.emergency_max_gpus_per_request < 0) {
        context.fail(section["max_gpus_per_request"], "emergency.max_gpus_per_request", "must be >= 0");
      }
    }
  }
  if (const YAML::Node section = root["preemption"]; section.IsDefined()) {
    context.keys(section, "preemption", {"min_runtime_s", "grace_s"});
    policy.min_runtime_s = context.get<int>(section["min_runtime_s"], "preemption.min_runtime_s", policy.min_runtime_s);
    policy.preempt_grace_s = context.get<int>(section["grace_s"], "preemption.grace_s", policy.preempt_grace_s);
  }
  if (const YAML::Node section = root["sharing"]; section.IsDefined()) {
    context.keys(section, "sharing", {"enabled", "max_leases_per_gpu", "models", "process_overhead_gib"});
    if (section["models"].IsDefined()) policy.shared_models = string_list(context, section["models"], "sharing.models");
    policy.sharing_enabled = context.get<bool>(section["enabled"], "sharing.enabled", false);
    policy.max_leases_per_gpu =
        context.get<int>(section["max_leases_per_gpu"], "sharing.max_leases_per_gpu", policy.max_leases_per_gpu);
    policy.process_overhead_gib = context.get<double>(section["process_overhead_gib"], "sharing.process_overhead_gib",
                                                      policy.process_overhead_gib);
  }
  if (const YAML::Node section = root["credits"]; section.IsDefined()) {
    context.keys(section, "credits",
                 {"monthly_gpu_hours", "loan_gpu_hours", "automatic_loan", "loan_applications_per_month",
                  "max_loan_gpu_hours_per_month", "max_grant_gpu_hours_per_quarter"});
    policy.monthly_gpu_hours =
        context.get<double>(section["monthly_gpu_hours"], "credits.monthly_gpu_hours", policy.monthly_gpu_hours);
    policy.loan_gpu_hours = context.get<double>(section["loan_gpu_hours"], "credits.loan_gpu_hours", 0);
    policy.automatic_loan = context.get<bool>(section["automatic_loan"], "credits.automatic_loan", true);
    policy.loan_applications_per_month =
        context.get<int>(section["loan_applications_per_month"], "credits.loan_applications_per_month",
                         policy.loan_applications_per_month);
    policy.max_loan_gpu_hours_per_month =
        context.get<double>(section["max_loan_gpu_hours_per_month"], "credits.max_loan_gpu_hours_per_month",
                            policy.max_loan_gpu_hours_per_month);
    policy.max_grant_gpu_hours_per_quarter =
        context.get<double>(section["max_grant_gpu_hours_per_quarter"], "credits.max_grant_gpu_hours_per_quarter",
                            policy.max_grant_gpu_hours_per_quarter);
  }
  if (const YAML::Node section = root["waste"]; section.IsDefined()) {
    context.keys(section, "waste", {"gpu_util_below", "after_s"});
    policy.waste_gpu_util_below =
        context.get<double>(section["gpu_util_below"], "waste.gpu_util_below", policy.waste_gpu_util_below);
    policy.waste_after_s = context.get<int>(section["after_s"], "waste.after_s", policy.waste_after_s);
  }
  if (const YAML::Node section = root["limits"]; section.IsDefined()) {
    context.keys(section, "limits", {"max_imgsz", "max_batch", "max_queued_per_user"});
    policy.max_imgsz = context.get<int>(section["max_imgsz"], "limits.max_imgsz", policy.max_imgsz);
    policy.max_batch = context.get<int>(section["max_batch"], "limits.max_batch", policy.max_batch);
    policy.max_queued_per_user =
        context.get<int>(section["max_queued_per_user"], "limits.max_queued_per_user", policy.max_queued_per_user);
  }
  if (const YAML::Node section = root["fair_share"]; section.IsDefined()) {
    context.keys(section, "fair_share", {"half_life_h"});
    policy.fair_share_half_life_h =
        context.get<double>(section["half_life_h"], "fair_share.half_life_h", policy.fair_share_half_life_h);
  }
  if (const YAML::Node table_node = root["memory_table"]; table_node.IsDefined()) {
    std::string path = context.get<std::string>(table_node, "memory_table", "");
    if (!path.empty() && path[0] != '/') path = base_dir + "/" + path;
    policy.memory_table = load_memory_table(path);
  }
  if (!tokens_source.empty()) merge_tokens(policy, tokens_yaml, tokens_source);
  policy.validate();
  return policy;
}
}  // namespace

Policy load_policy(const std::string& path, const std::string& tokens_path) {
  const std::string text = read_file(path);
  const auto slash = path.find_last_of('/');
  return load_policy_from_string(text, path, slash == std::string::npos ? "." : path.substr(0, slash),
                                 tokens_path.empty() ? "" : read_file(tokens_path), tokens_path);
}

Policy local_policy(int gpu_count, double memory_gib, const std::string& user) {
  Policy policy;
  policy.source = "local";
  for (int i = 0; i < std::max(1, gpu_count); ++i) {
    policy.gpus.push_back(Gpu{"local", i, memory_gib > 0 ? memory_gib : 16, ""});
  }
  policy.emergency_pool_fraction = 0;
  Team team;
  team.name = "local";
  team.base = team.burst = policy.total_gpus();
  team.leads = {user};
  policy.teams[team.name] = team;
  User lead;
  lead.name = user;
  lead.team = "local";
  lead.role = Role::kLead;
  lead.token_sha256 = std::string(64, '0');
  policy.users[user] = lead;
  policy.self_service_models.clear();
  policy.approval_models.clear();
  policy.unknown_models_need_approval = false;
  policy.monthly_gpu_hours = 0;
  policy.min_runtime_s = 0;
  policy.emergency_max_gpus_per_request = policy.total_gpus();  // one workstation: its user may take all of it
  policy.sharing_enabled = true;
  return policy;
}

namespace {

std::string number_text(double value) {
  std::ostringstream text;
  text << value;
  return text.str();
}

std::string joined(const std::vector<std::string>& items) {
  std::string text;
  for (const auto& item : items) text += (text.empty() ? "" : ",") + item;
  return "[" + text + "]";
}

const char* role_name(Role role) { return role == Role::kAdmin ? "admin" : role == Role::kLead ? "lead" : "member"; }

}  // namespace

std::string policy_change_summary(const Policy& before, const Policy& after) {
  std::vector<std::string> clauses;
  auto changed = [&](const std::string& what, const std::string& from, const std::string& to) {
    if (from != to) clauses.push_back(what + " " + from + " -> " + to);
  };
  for (const auto& [name, team] : before.teams) {
    auto it = after.teams.find(name);
    if (it == after.teams.end()) {
      clauses.push_back("team " + name + " removed");
      continue;
    }
    const Team& next = it->second;
    changed("team " + name + ": base", number_text(team.base), number_text(next.base));
    changed("team " + name + ": burst", number_text(team.burst), number_text(next.burst));
    if (team.share >= 0 || next.share >= 0) {  // unset, the share follows the base
      changed("team " + name + ": share", number_text(team.share_weight()), number_text(next.share_weight()));
    }
    changed("team " + name + ": max_gpus_per_user", std::to_string(team.max_gpus_per_user),
            std::to_string(next.max_gpus_per_user));
    changed("team " + name + ": leads", joined(team.leads), joined(next.leads));
    changed("team " + name + ": members", joined(team.members), joined(next.members));
    if (team.burst_windows.size() != next.burst_windows.size()) {
      changed("team " + name + ": burst windows", std::to_string(team.burst_windows.size()),
              std::to_string(next.burst_windows.size()));
    }
  }
  for (const auto& [name, team] : after.teams) {
    if (!before.teams.count(name)) {
      clauses.push_back("team " + name + " added (base " + number_text(team.base) + ", burst " +
                        number_text(team.burst) + ")");
    }
  }
  for (const auto& [name, user] : before.users) {
    auto it = after.users.find(name);
    if (it == after.users.end()) {
      clauses.push_back("user " + name + " removed");
      continue;
    }
    const User& next = it->second;
    changed("user " + name + ": team", user.team.empty() ? "-" : user.team, next.team.empty() ? "-" : next.team);
    changed("user " + name + ": role", role_name(user.role), role_name(next.role));
    // names only: a hash in the audit log would help nobody and outlive the rotation
    if (user.token_sha256 != next.token_sha256 || user.token_salt != next.token_salt) {
      clauses.push_back("user " + name + ": token replaced");
    }
    if (user.previous_token_sha256 != next.previous_token_sha256 ||
        user.previous_token_until_ms != next.previous_token_until_ms) {
      clauses.push_back("user " + name +
                        (next.previous_token_sha256.empty() ? ": previous token dropped" : ": previous token kept"));
    }
  }
  for (const auto& [name, user] : after.users) {
    if (!before.users.count(name)) {
      clauses.push_back("user " + name + " added (" + (user.team.empty() ? role_name(user.role) : user.team) + ")");
    }
  }
  changed("ttl_s", std::to_string(before.ttl_s), std::to_string(after.ttl_s));
  changed("heartbeat_interval_s", std::to_string(before.heartbeat_interval_s),
          std::to_string(after.heartbeat_interval_s));
  changed("emergency pool GPUs", std::to_string(before.emergency_pool_gpus()),
          std::to_string(after.emergency_pool_gpus()));
  changed("max_queued_per_user", std::to_string(before.max_queued_per_user), std::to_string(after.max_queued_per_user));
  changed("monthly_gpu_hours", number_text(before.monthly_gpu_hours), number_text(after.monthly_gpu_hours));
  std::string text;
  for (const auto& clause : clauses) text += (text.empty() ? "" : "; ") + clause;
  return text;
}

std::string reload_refusal(const Policy& before, const Policy& after) {
  bool same_inventory = before.gpus.size() == after.gpus.size();
  for (size_t i = 0; same_inventory && i < before.gpus.size(); ++i) {
    const Gpu& left = before.gpus[i];
    const Gpu& right = after.gpus[i];
    same_inventory = left.id() == right.id() && left.memory_gib == right.memory_gib && left.uuid == right.uuid;
  }
  if (!same_inventory) {
    return "inventory: changed; the held leases name its GPUs, so an inventory change needs a restart of quotad "
           "(which checks the stored leases against it)";
  }
  if (before.waste_gpu_util_below != after.waste_gpu_util_below || before.waste_after_s != after.waste_after_s) {
    return "waste: changed; the running utilisation runs were measured against the old thresholds, so a change "
           "needs a restart of quotad";
  }
  return "";
}

}  // namespace yolo8::quota
