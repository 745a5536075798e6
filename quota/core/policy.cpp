#include "quota/core/policy.h"

#include "quota/core/sha256.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>

namespace yolo8::quota {

std::string to_string(Priority p) {
  switch (p) {
    case Priority::kLow: return "low";
    case Priority::kNormal: return "normal";
    case Priority::kHigh: return "high";
    case Priority::kCritical: return "critical";
  }
  return "normal";
}

Priority parse_priority(const std::string& s) {
  if (s == "low") return Priority::kLow;
  if (s == "normal" || s.empty()) return Priority::kNormal;
  if (s == "high") return Priority::kHigh;
  if (s == "critical") return Priority::kCritical;
  throw PolicyError("priority: '" + s + "' is not one of low, normal, high, critical");
}

// ---- civil time (days-from-civil arithmetic on the proleptic Gregorian calendar) ----
namespace {
constexpr int64_t kMsPerDay = 86400000;

int64_t floor_div(int64_t a, int64_t b) { return a / b - ((a % b != 0) && ((a < 0) != (b < 0))); }

void civil_from_days(int64_t z, int& y, unsigned& m, unsigned& d) {
  z += 719468;
  const int64_t era = (z >= 0 ? z : z - 146096) / 146097;
  const unsigned doe = unsigned(z - era * 146097);
  const unsigned yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
  const int64_t yy = int64_t(yoe) + era * 400;
  const unsigned doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
  const unsigned mp = (5 * doy + 2) / 153;
  d = doy - (153 * mp + 2) / 5 + 1;
  m = mp < 10 ? mp + 3 : mp - 9;
  y = int(yy + (m <= 2));
}
}  // namespace

int weekday_of(int64_t ms_local) {
  const int64_t days = floor_div(ms_local, kMsPerDay);
  // 1970-01-01 was a Thursday (index 3 with Monday = 0)
  return int(((days % 7) + 7 + 3) % 7);
}

int minute_of_day(int64_t ms_local) {
  const int64_t days = floor_div(ms_local, kMsPerDay);
  return int((ms_local - days * kMsPerDay) / 60000);
}

std::string month_key(int64_t ms_utc) {
  int y;
  unsigned m, d;
  civil_from_days(floor_div(ms_utc, kMsPerDay), y, m, d);
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%04d-%02u", y, m);
  return buf;
}

std::string previous_month_key(const std::string& month) {
  int y = std::atoi(month.substr(0, 4).c_str());
  int m = std::atoi(month.substr(5, 2).c_str()) - 1;
  if (m == 0) {
    m = 12;
    --y;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%04d-%02d", y, m);
  return buf;
}

int parse_utc_offset_min(const std::string& tz_in) {
  std::string tz = tz_in;
  if (tz == "UTC" || tz == "Z" || tz == "Etc/UTC" || tz == "GMT") return 0;
  if (tz.rfind("UTC", 0) == 0) tz = tz.substr(3);
  int h = 0, m = 0;
  char sign = 0;
  char extra = 0;
  if (tz.size() == 6 && std::sscanf(tz.c_str(), "%c%2d:%2d%c", &sign, &h, &m, &extra) == 3 &&
      (sign == '+' || sign == '-') && h <= 14 && m < 60) {
    return (sign == '-' ? -1 : 1) * (h * 60 + m);
  }
  throw PolicyError("time zone '" + tz_in +
                    "' is not supported: use UTC or a fixed offset such as +01:00 (named zones are not supported)");
}

bool BurstWindow::contains(int64_t now_ms) const {
  const int64_t local = now_ms + int64_t(utc_offset_min) * 60000;
  const int minute = minute_of_day(local);
  const int day = weekday_of(local);
  auto has_day = [&](int d) { return std::find(weekdays.begin(), weekdays.end(), d) != weekdays.end(); };
  if (from_min <= to_min) return has_day(day) && minute >= from_min && minute < to_min;
  // wraps past midnight: the part after midnight belongs to the previous day's window
  if (minute >= from_min) return has_day(day);
  if (minute < to_min) return has_day((day + 6) % 7);
  return false;
}

bool Team::in_burst_window(int64_t now_ms) const {
  for (const auto& w : burst_windows) {
    if (w.contains(now_ms)) return true;
  }
  return false;
}

double Team::limit_at(int64_t now_ms) const { return in_burst_window(now_ms) ? burst : base; }

double MemoryTable::estimate_gib(const std::string& model, int imgsz, int batch_per_gpu) const {
  auto it = models.find(model);
  if (it == models.end()) return 0;
  const double scale = (double(imgsz) / 640.0) * (double(imgsz) / 640.0);
  return it->second.fixed_gib + it->second.per_image_gib * scale * batch_per_gpu;
}

int MemoryTable::max_batch(const std::string& model, int imgsz, double memory_gib) const {
  auto it = models.find(model);
  if (it == models.end()) return 0;
  const double scale = (double(imgsz) / 640.0) * (double(imgsz) / 640.0);
  const double per = it->second.per_image_gib * scale;
  const double room = memory_gib - it->second.fixed_gib;
  if (room <= 0 || per <= 0) return 0;
  return int(std::floor(room / per + 1e-9));
}

int Policy::emergency_pool_gpus() const {
  return int(std::ceil(emergency_pool_fraction * total_gpus() - 1e-9));
}

double Policy::max_gpu_memory_gib() const {
  double m = 0;
  for (const auto& g : gpus) m = std::max(m, g.memory_gib);
  return m;
}

bool Policy::needs_approval(const std::string& model) const {
  auto in = [&](const std::vector<std::string>& v) { return std::find(v.begin(), v.end(), model) != v.end(); };
  if (in(self_service_models)) return false;
  if (in(approval_models)) return true;
  return unknown_models_need_approval;
}

const User* Policy::find_user_by_token(const std::string& token) const {
  if (token.empty()) return nullptr;
  const std::string h = sha256_hex(token);
  for (const auto& [name, u] : users) {
    if (u.token_sha256 == h) return &u;
  }
  return nullptr;
}

void Policy::validate() const {
  const std::string where = source.empty() ? "policy" : source;
  auto fail = [&](const std::string& key, const std::string& msg) {
    throw PolicyError(where + ": " + key + ": " + msg);
  };
  if (gpus.empty()) fail("inventory", "no GPUs listed");
  for (const auto& g : gpus) {
    if (!(g.memory_gib > 0)) fail("inventory." + g.node + ".memory_gib", "must be > 0");
  }
  if (emergency_pool_fraction < 0 || emergency_pool_fraction > 0.5) {
    fail("emergency_pool", "fraction must be within [0, 0.5] (the department uses 0.15-0.20)");
  }
  if (default_gpus < 1) fail("defaults.gpus", "must be >= 1");
  if (ttl_s <= 0) fail("leases.ttl_s", "must be > 0");
  if (heartbeat_interval_s <= 0 || heartbeat_interval_s >= ttl_s) {
    fail("leases.heartbeat_interval_s", "must be > 0 and below ttl_s");
  }
  if (expiry_grace_s < 0) fail("leases.expiry_grace_s", "must be >= 0");
  if (min_runtime_s < 0) fail("preemption.min_runtime_s", "must be >= 0");
  if (preempt_grace_s < 0) fail("preemption.grace_s", "must be >= 0");
  if (max_leases_per_gpu < 1) fail("sharing.max_leases_per_gpu", "must be >= 1");
  if (loan_gpu_hours < 0) fail("credits.loan_gpu_hours", "must be >= 0");
  if (!(waste_gpu_util_below >= 0 && waste_gpu_util_below <= 1)) fail("waste.gpu_util_below", "must be within [0, 1]");
  if (waste_after_s < 0) fail("waste.after_s", "must be >= 0");
  double base_sum = 0;
  for (const auto& [name, t] : teams) {
    const std::string k = "teams." + name;
    if (t.base < 0) fail(k + ".base", "must be >= 0");
    if (t.burst < t.base) fail(k + ".burst", "must be >= base");
    if (t.burst > total_gpus()) fail(k + ".burst", "exceeds the inventory of " + std::to_string(total_gpus()) + " GPUs");
    base_sum += t.base;
    for (const auto& u : t.leads) {
      if (!users.count(u)) fail(k + ".leads", "unknown user '" + u + "'");
    }
    for (const auto& u : t.members) {
      if (!users.count(u)) fail(k + ".members", "unknown user '" + u + "'");
    }
  }
  if (base_sum > total_gpus() - emergency_pool_gpus() + 1e-9) {
    fail("teams", "the sum of base GPUs exceeds the inventory minus the emergency pool");
  }
  std::set<std::string> hashes;
  for (const auto& [name, u] : users) {
    if (u.token_sha256.size() != 64) fail("users." + name + ".token_sha256", "must be 64 hex digits");
    if (!hashes.insert(u.token_sha256).second) fail("users." + name + ".token_sha256", "duplicate token");
    if (u.role != Role::kAdmin && !teams.count(u.team)) fail("users." + name, "belongs to no team");
  }
}

// ---- YAML loading ----
namespace {

struct Ctx {
  std::string source;
  [[noreturn]] void fail(const YAML::Node& n, const std::string& key, const std::string& msg) const {
    std::ostringstream os;
    os << source;
    if (n.IsDefined() && n.Mark().line >= 0) os << ":" << (n.Mark().line + 1);
    os << ": " << key << ": " << msg;
    throw PolicyError(os.str());
  }
  void keys(const YAML::Node& n, const std::string& key, std::initializer_list<const char*> allowed) const {
    if (!n.IsMap()) fail(n, key.empty() ? "(top level)" : key, "must be a mapping");
    for (const auto& kv : n) {
      const std::string k = kv.first.as<std::string>();
      bool ok = false;
      for (const char* a : allowed) ok = ok || k == a;
      if (!ok) fail(kv.first, key.empty() ? k : key + "." + k, "unknown key");
    }
  }
  template <typename T>
  T get(const YAML::Node& n, const std::string& key, T fallback) const {
    if (!n.IsDefined() || n.IsNull()) return fallback;
    try {
      return n.as<T>();
    } catch (const YAML::Exception&) {
      fail(n, key, "has the wrong type");
    }
  }
  template <typename T>
  T need(const YAML::Node& parent, const char* name, const std::string& key) const {
    const YAML::Node n = parent[name];
    if (!n.IsDefined() || n.IsNull()) fail(parent, key, "is required");
    return get<T>(n, key, T{});
  }
};

int parse_hhmm(const Ctx& c, const YAML::Node& n, const std::string& key) {
  const std::string s = c.get<std::string>(n, key, "");
  int h = -1, m = -1;
  char extra = 0;
  if (std::sscanf(s.c_str(), "%2d:%2d%c", &h, &m, &extra) != 2 || h < 0 || h > 24 || m < 0 || m > 59 ||
      (h == 24 && m != 0)) {
    c.fail(n, key, "'" + s + "' is not HH:MM");
  }
  return h * 60 + m;
}

int parse_weekday(const Ctx& c, const YAML::Node& n, const std::string& key) {
  static const char* kDays[] = {"mon", "tue", "wed", "thu", "fri", "sat", "sun"};
  std::string s = c.get<std::string>(n, key, "");
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char ch) { return char(std::tolower(ch)); });
  for (int i = 0; i < 7; ++i) {
    if (s.substr(0, 3) == kDays[i]) return i;
  }
  c.fail(n, key, "'" + s + "' is not a weekday (mon..sun)");
}

std::vector<std::string> string_list(const Ctx& c, const YAML::Node& n, const std::string& key) {
  std::vector<std::string> out;
  if (!n.IsDefined() || n.IsNull()) return out;
  if (!n.IsSequence()) c.fail(n, key, "must be a list");
  for (size_t i = 0; i < n.size(); ++i) out.push_back(c.get<std::string>(n[i], key, ""));
  return out;
}

MemoryTable parse_memory_table(const Ctx& c, const YAML::Node& root) {
  MemoryTable t;
  c.keys(root, "", {"models", "reference_imgsz", "note", "source"});
  if (root["reference_imgsz"].IsDefined() && c.get<int>(root["reference_imgsz"], "reference_imgsz", 640) != 640) {
    c.fail(root["reference_imgsz"], "reference_imgsz", "only 640 is supported");
  }
  const YAML::Node models = root["models"];
  if (!models.IsMap()) c.fail(root, "models", "must be a mapping of model -> {fixed_gib, per_image_gib}");
  for (const auto& kv : models) {
    const std::string name = kv.first.as<std::string>();
    const std::string k = "models." + name;
    c.keys(kv.second, k, {"fixed_gib", "per_image_gib"});
    MemoryEstimate e;
    e.fixed_gib = c.need<double>(kv.second, "fixed_gib", k + ".fixed_gib");
    e.per_image_gib = c.need<double>(kv.second, "per_image_gib", k + ".per_image_gib");
    if (e.fixed_gib < 0 || e.per_image_gib <= 0) c.fail(kv.second, k, "values must be positive");
    t.models[name] = e;
  }
  return t;
}

YAML::Node parse_yaml(const std::string& text, const std::string& source) {
  try {
    return YAML::Load(text);
  } catch (const YAML::ParserException& e) {
    throw PolicyError(source + ":" + std::to_string(e.mark.line + 1) + ": YAML syntax error: " + e.msg);
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
  Ctx c{path};
  try {
    return parse_memory_table(c, parse_yaml(read_file(path), path));
  } catch (const YAML::Exception& e) {
    throw PolicyError(path + ":" + std::to_string(e.mark.line + 1) + ": " + e.msg);
  }
}

namespace {
Policy parse_policy(const std::string& yaml, const std::string& source, const std::string& base_dir);
}  // namespace

Policy load_policy_from_string(const std::string& yaml, const std::string& source, const std::string& base_dir) {
  try {
    return parse_policy(yaml, source, base_dir);
  } catch (const YAML::Exception& e) {
    // e.g. a mapping used as a key: still name the place
    throw PolicyError(source + ":" + std::to_string(e.mark.line + 1) + ": " + e.msg);
  }
}

namespace {
Policy parse_policy(const std::string& yaml, const std::string& source, const std::string& base_dir) {
  Ctx c{source};
  const YAML::Node root = parse_yaml(yaml, source);
  Policy p;
  p.source = source;
  c.keys(root, "", {"inventory", "teams", "users", "emergency_pool", "defaults", "tiers", "leases", "preemption",
                    "sharing", "credits", "memory_table", "limits", "waste"});
  // inventory
  const YAML::Node inv = root["inventory"];
  if (!inv.IsDefined()) c.fail(root, "inventory", "is required");
  c.keys(inv, "inventory", {"nodes"});
  const YAML::Node nodes = inv["nodes"];
  if (!nodes.IsSequence() || nodes.size() == 0) c.fail(inv, "inventory.nodes", "must be a non-empty list");
  std::set<std::string> node_names;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const std::string k = "inventory.nodes[" + std::to_string(i) + "]";
    c.keys(nodes[i], k, {"name", "gpus", "memory_gib"});
    const std::string name = c.need<std::string>(nodes[i], "name", k + ".name");
    if (!node_names.insert(name).second) c.fail(nodes[i], k + ".name", "duplicate node '" + name + "'");
    const int count = c.need<int>(nodes[i], "gpus", k + ".gpus");
    const double mem = c.need<double>(nodes[i], "memory_gib", k + ".memory_gib");
    if (count < 1 || count > 64) c.fail(nodes[i]["gpus"], k + ".gpus", "must be within 1..64");
    if (!(mem > 0)) c.fail(nodes[i]["memory_gib"], k + ".memory_gib", "must be > 0");
    for (int g = 0; g < count; ++g) p.gpus.push_back(Gpu{name, g, mem});
  }
  p.emergency_pool_fraction = c.get<double>(root["emergency_pool"], "emergency_pool", 0.15);
  // users
  const YAML::Node users = root["users"];
  std::map<std::string, YAML::Node> user_nodes;
  if (users.IsDefined() && !users.IsNull()) {
    if (!users.IsMap()) c.fail(users, "users", "must be a mapping of name -> {token_sha256, role}");
    for (const auto& kv : users) user_nodes[kv.first.as<std::string>()] = kv.second;
  }
  for (const auto& [name, n] : user_nodes) {
    const std::string k = "users." + name;
    c.keys(n, k, {"token_sha256", "role"});
    User u;
    u.name = name;
    u.token_sha256 = c.need<std::string>(n, "token_sha256", k + ".token_sha256");
    std::transform(u.token_sha256.begin(), u.token_sha256.end(), u.token_sha256.begin(),
                   [](unsigned char ch) { return char(std::tolower(ch)); });
    const std::string role = c.get<std::string>(n["role"], k + ".role", "member");
    if (role == "admin") {
      u.role = Role::kAdmin;
    } else if (role != "member") {
      c.fail(n["role"], k + ".role", "'" + role + "' is not member or admin (leads are listed under their team)");
    }
    p.users[name] = u;
  }
  // teams
  const YAML::Node teams = root["teams"];
  if (!teams.IsMap() || teams.size() == 0) c.fail(root, "teams", "must be a non-empty mapping");
  for (const auto& kv : teams) {
    Team t;
    t.name = kv.first.as<std::string>();
    const std::string k = "teams." + t.name;
    const YAML::Node n = kv.second;
    c.keys(n, k, {"base", "burst", "burst_windows", "leads", "members"});
    t.base = c.need<double>(n, "base", k + ".base");
    t.burst = c.get<double>(n["burst"], k + ".burst", t.base);
    t.leads = string_list(c, n["leads"], k + ".leads");
    t.members = string_list(c, n["members"], k + ".members");
    const YAML::Node wins = n["burst_windows"];
    if (wins.IsDefined() && !wins.IsNull()) {
      if (!wins.IsSequence()) c.fail(wins, k + ".burst_windows", "must be a list");
      for (size_t i = 0; i < wins.size(); ++i) {
        const std::string wk = k + ".burst_windows[" + std::to_string(i) + "]";
        c.keys(wins[i], wk, {"days", "from", "to", "timezone"});
        BurstWindow w;
        const YAML::Node days = wins[i]["days"];
        if (!days.IsSequence() || days.size() == 0) c.fail(wins[i], wk + ".days", "must be a non-empty list");
        for (size_t d = 0; d < days.size(); ++d) w.weekdays.push_back(parse_weekday(c, days[d], wk + ".days"));
        if (!wins[i]["from"].IsDefined()) c.fail(wins[i], wk + ".from", "is required");
        if (!wins[i]["to"].IsDefined()) c.fail(wins[i], wk + ".to", "is required");
        w.from_min = parse_hhmm(c, wins[i]["from"], wk + ".from");
        w.to_min = parse_hhmm(c, wins[i]["to"], wk + ".to");
        if (w.from_min == w.to_min) c.fail(wins[i], wk, "from and to are equal");
        w.timezone = c.get<std::string>(wins[i]["timezone"], wk + ".timezone", "UTC");
        try {
          w.utc_offset_min = parse_utc_offset_min(w.timezone);
        } catch (const PolicyError& e) {
          c.fail(wins[i]["timezone"], wk + ".timezone", e.what());
        }
        t.burst_windows.push_back(w);
      }
    }
    for (const auto& lead : t.leads) {
      auto it = p.users.find(lead);
      if (it == p.users.end()) c.fail(n["leads"], k + ".leads", "unknown user '" + lead + "'");
      if (!it->second.team.empty() && it->second.team != t.name) {
        c.fail(n["leads"], k + ".leads", "user '" + lead + "' already belongs to team " + it->second.team);
      }
      it->second.team = t.name;
      if (it->second.role != Role::kAdmin) it->second.role = Role::kLead;
    }
    for (const auto& m : t.members) {
      auto it = p.users.find(m);
      if (it == p.users.end()) c.fail(n["members"], k + ".members", "unknown user '" + m + "'");
      if (!it->second.team.empty() && it->second.team != t.name) {
        c.fail(n["members"], k + ".members", "user '" + m + "' already belongs to team " + it->second.team);
      }
      it->second.team = t.name;
    }
    p.teams[t.name] = t;
  }
  // defaults
  if (const YAML::Node d = root["defaults"]; d.IsDefined()) {
    c.keys(d, "defaults", {"gpus", "memory_gib", "memory_gib_other"});
    p.default_gpus = c.get<int>(d["gpus"], "defaults.gpus", 1);
    if (const YAML::Node m = d["memory_gib"]; m.IsDefined()) {
      if (!m.IsMap()) c.fail(m, "defaults.memory_gib", "must be a mapping of model -> GiB");
      for (const auto& kv : m) {
        p.default_memory_gib[kv.first.as<std::string>()] =
            c.get<double>(kv.second, "defaults.memory_gib." + kv.first.as<std::string>(), 0);
      }
    }
    p.default_memory_fallback_gib = c.get<double>(d["memory_gib_other"], "defaults.memory_gib_other", 8);
  }
  if (const YAML::Node t = root["tiers"]; t.IsDefined()) {
    c.keys(t, "tiers", {"self_service", "approval", "custom_models_need_approval"});
    if (t["self_service"].IsDefined()) p.self_service_models = string_list(c, t["self_service"], "tiers.self_service");
    if (t["approval"].IsDefined()) p.approval_models = string_list(c, t["approval"], "tiers.approval");
    p.unknown_models_need_approval =
        c.get<bool>(t["custom_models_need_approval"], "tiers.custom_models_need_approval", true);
  }
  if (const YAML::Node l = root["leases"]; l.IsDefined()) {
    c.keys(l, "leases", {"ttl_s", "heartbeat_interval_s", "expiry_grace_s"});
    p.ttl_s = c.get<int>(l["ttl_s"], "leases.ttl_s", p.ttl_s);
    p.heartbeat_interval_s = c.get<int>(l["heartbeat_interval_s"], "leases.heartbeat_interval_s", p.heartbeat_interval_s);
    p.expiry_grace_s = c.get<int>(l["expiry_grace_s"], "leases.expiry_grace_s", p.expiry_grace_s);
  }
  if (const YAML::Node l = root["preemption"]; l.IsDefined()) {
    c.keys(l, "preemption", {"min_runtime_s", "grace_s"});
    p.min_runtime_s = c.get<int>(l["min_runtime_s"], "preemption.min_runtime_s", p.min_runtime_s);
    p.preempt_grace_s = c.get<int>(l["grace_s"], "preemption.grace_s", p.preempt_grace_s);
  }
  if (const YAML::Node l = root["sharing"]; l.IsDefined()) {
    c.keys(l, "sharing", {"enabled", "max_leases_per_gpu"});
    p.sharing_enabled = c.get<bool>(l["enabled"], "sharing.enabled", false);
    p.max_leases_per_gpu = c.get<int>(l["max_leases_per_gpu"], "sharing.max_leases_per_gpu", p.max_leases_per_gpu);
  }
  if (const YAML::Node l = root["credits"]; l.IsDefined()) {
    c.keys(l, "credits", {"monthly_gpu_hours", "loan_gpu_hours"});
    p.monthly_gpu_hours = c.get<double>(l["monthly_gpu_hours"], "credits.monthly_gpu_hours", p.monthly_gpu_hours);
    p.loan_gpu_hours = c.get<double>(l["loan_gpu_hours"], "credits.loan_gpu_hours", 0);
  }
  if (const YAML::Node l = root["waste"]; l.IsDefined()) {
    c.keys(l, "waste", {"gpu_util_below", "after_s"});
    p.waste_gpu_util_below = c.get<double>(l["gpu_util_below"], "waste.gpu_util_below", p.waste_gpu_util_below);
    p.waste_after_s = c.get<int>(l["after_s"], "waste.after_s", p.waste_after_s);
  }
  if (const YAML::Node l = root["limits"]; l.IsDefined()) {
    c.keys(l, "limits", {"max_imgsz", "max_batch"});
    p.max_imgsz = c.get<int>(l["max_imgsz"], "limits.max_imgsz", p.max_imgsz);
    p.max_batch = c.get<int>(l["max_batch"], "limits.max_batch", p.max_batch);
  }
  if (const YAML::Node m = root["memory_table"]; m.IsDefined()) {
    std::string path = c.get<std::string>(m, "memory_table", "");
    if (!path.empty() && path[0] != '/') path = base_dir + "/" + path;
    p.memory_table = load_memory_table(path);
  }
  p.validate();
  return p;
}
}  // namespace

Policy load_policy(const std::string& path) {
  const std::string text = read_file(path);
  const auto slash = path.find_last_of('/');
  return load_policy_from_string(text, path, slash == std::string::npos ? "." : path.substr(0, slash));
}

Policy local_policy(int gpu_count, double memory_gib, const std::string& user) {
  Policy p;
  p.source = "local";
  for (int i = 0; i < std::max(1, gpu_count); ++i) p.gpus.push_back(Gpu{"local", i, memory_gib > 0 ? memory_gib : 16});
  p.emergency_pool_fraction = 0;
  Team t;
  t.name = "local";
  t.base = t.burst = p.total_gpus();
  t.leads = {user};
  p.teams[t.name] = t;
  User u;
  u.name = user;
  u.team = "local";
  u.role = Role::kLead;
  u.token_sha256 = std::string(64, '0');
  p.users[user] = u;
  p.self_service_models.clear();
  p.approval_models.clear();
  p.unknown_models_need_approval = false;
  p.monthly_gpu_hours = 0;
  p.min_runtime_s = 0;
  p.sharing_enabled = true;
  return p;
}

}  // namespace yolo8::quota
