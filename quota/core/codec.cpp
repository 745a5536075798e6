#include "quota/core/codec.h"

namespace yolo8::quota {

using nlohmann::json;

namespace {

template <typename T>
T field(const json& j, const char* key, T fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  try {
    if constexpr (std::is_same_v<T, bool>) {
      if (!it->is_boolean()) throw RequestError("");
    } else if constexpr (std::is_arithmetic_v<T>) {
      if (!it->is_number()) throw RequestError("");
      if constexpr (std::is_integral_v<T>) {
        const double v = it->get<double>();
        if (v != double(int64_t(v)) || v < -9e15 || v > 9e15) throw RequestError("");
      }
    } else {
      if (!it->is_string()) throw RequestError("");
    }
    return it->get<T>();
  } catch (const std::exception&) {
    throw RequestError(std::string(key) + ": has the wrong type");
  }
}

std::string bounded(const json& j, const char* key, size_t max_len, const std::string& fallback = "") {
  std::string s = field<std::string>(j, key, fallback);
  if (s.size() > max_len) throw RequestError(std::string(key) + ": longer than " + std::to_string(max_len) + " characters");
  return s;
}

int bounded_int(const json& j, const char* key, int fallback) {
  const int64_t v = field<int64_t>(j, key, fallback);
  if (v < -1000000 || v > 1000000) throw RequestError(std::string(key) + ": out of range");
  return int(v);
}

}  // namespace

json to_json(const LeaseRequest& r) {
  return json{{"team", r.team},
              {"user", r.user},
              {"job", r.job},
              {"model", r.model},
              {"imgsz", r.imgsz},
              {"batch", r.batch},
              {"gpus", r.gpus},
              {"memory_gib", r.memory_gib},
              {"priority", to_string(r.priority)},
              {"preemptible", r.preemptible},
              {"shared", r.shared},
              {"justification", r.justification},
              {"idempotency_key", r.idempotency_key}};
}

json to_json(const Telemetry& t) {
  return json{{"step", t.step},
              {"epoch", t.epoch},
              {"gpu_util", t.gpu_util},
              {"memory_used_gib", t.memory_used_gib},
              {"last_checkpoint_ms", t.last_checkpoint_ms}};
}

json to_json(const Lease& l, const Policy& policy) {
  json devices = json::array();
  for (int d : l.devices) {
    devices.push_back(d >= 0 && size_t(d) < policy.gpus.size() ? policy.gpus[size_t(d)].id() : std::to_string(d));
  }
  return json{{"id", l.id},
              {"request", to_json(l.req)},
              {"state", to_string(l.state)},
              {"outcome", to_string(l.outcome)},
              {"gpus", l.gpus},
              {"memory_gib", l.memory_gib},
              {"shared", l.shared},
              {"device_index", l.devices},
              {"devices", devices},
              {"over_base", l.over_base},
              {"emergency", l.emergency},
              {"review_pending", l.review_pending},
              {"approval_id", l.approval_id},
              {"created_ms", l.created_ms},
              {"granted_ms", l.granted_ms},
              {"last_seen_ms", l.last_seen_ms},
              {"deadline_ms", l.deadline_ms},
              {"ended_ms", l.ended_ms},
              {"free_at_ms", l.free_at_ms},
              {"charged_until_ms", l.charged_until_ms},
              {"gpu_hours", l.gpu_hours},
              {"preempted_for", l.preempted_for},
              {"waiting_on", l.waiting_on},
              {"reason", l.reason},
              {"telemetry", to_json(l.telemetry)}};
}

json to_json(const Approval& a) {
  return json{{"id", a.id},         {"lease_id", a.lease_id},     {"team", a.team},
              {"user", a.user},     {"model", a.model},           {"justification", a.justification},
              {"state", a.state},   {"decided_by", a.decided_by}, {"note", a.note},
              {"created_ms", a.created_ms}, {"decided_ms", a.decided_ms}};
}

json to_json(const AuditEntry& a) {
  return json{{"seq", a.seq},           {"ts_ms", a.ts_ms}, {"actor", a.actor}, {"action", a.action},
              {"lease_id", a.lease_id}, {"team", a.team},   {"detail", a.detail}};
}

LeaseRequest lease_request_from_json(const json& j) {
  if (!j.is_object()) throw RequestError("body: must be a JSON object");
  LeaseRequest r;
  r.team = bounded(j, "team", 128);
  r.user = bounded(j, "user", 128);
  r.job = bounded(j, "job", 256);
  r.model = bounded(j, "model", 256, "yolov8n");
  r.imgsz = bounded_int(j, "imgsz", 640);
  auto batch = j.find("batch");
  if (batch != j.end() && batch->is_string()) {
    if (*batch != "auto") throw RequestError("batch: must be a number or \"auto\"");
    r.batch = 0;
  } else {
    r.batch = bounded_int(j, "batch", 0);
  }
  r.gpus = bounded_int(j, "gpus", 0);
  r.memory_gib = field<double>(j, "memory_gib", 0);
  try {
    r.priority = parse_priority(field<std::string>(j, "priority", "normal"));
  } catch (const PolicyError& e) {
    throw RequestError(e.what());
  }
  r.preemptible = field<bool>(j, "preemptible", true);
  r.shared = field<bool>(j, "shared", false);
  r.justification = bounded(j, "justification", 2000);
  r.idempotency_key = bounded(j, "idempotency_key", 128);
  return r;
}

Telemetry telemetry_from_json(const json& j) {
  Telemetry t;
  if (j.is_null()) return t;
  if (!j.is_object()) throw RequestError("body: must be a JSON object");
  t.step = field<int64_t>(j, "step", -1);
  t.epoch = bounded_int(j, "epoch", -1);
  t.gpu_util = field<double>(j, "gpu_util", -1);
  t.memory_used_gib = field<double>(j, "memory_used_gib", -1);
  t.last_checkpoint_ms = field<int64_t>(j, "last_checkpoint_ms", 0);
  if (t.gpu_util > 1.0 + 1e-9) throw RequestError("gpu_util: a fraction within 0..1");
  return t;
}

Lease lease_from_json(const json& j) {
  Lease l;
  l.id = j.at("id").get<int64_t>();
  const json& r = j.at("request");
  l.req.team = r.value("team", "");
  l.req.user = r.value("user", "");
  l.req.job = r.value("job", "");
  l.req.model = r.value("model", "");
  l.req.imgsz = r.value("imgsz", 640);
  l.req.batch = r.value("batch", 0);
  l.req.gpus = r.value("gpus", 0);
  l.req.memory_gib = r.value("memory_gib", 0.0);
  l.req.priority = parse_priority(r.value("priority", "normal"));
  l.req.preemptible = r.value("preemptible", true);
  l.req.shared = r.value("shared", false);
  l.req.justification = r.value("justification", "");
  l.req.idempotency_key = r.value("idempotency_key", "");
  l.state = parse_lease_state(j.at("state").get<std::string>());
  l.outcome = parse_outcome(j.value("outcome", ""));
  l.gpus = j.value("gpus", 1);
  l.memory_gib = j.value("memory_gib", 0.0);
  l.shared = j.value("shared", false);
  l.devices = j.value("device_index", std::vector<int>{});
  l.device_ids = j.value("devices", std::vector<std::string>{});
  l.over_base = j.value("over_base", false);
  l.emergency = j.value("emergency", false);
  l.review_pending = j.value("review_pending", false);
  l.approval_id = j.value("approval_id", int64_t(0));
  l.created_ms = j.value("created_ms", int64_t(0));
  l.granted_ms = j.value("granted_ms", int64_t(0));
  l.last_seen_ms = j.value("last_seen_ms", int64_t(0));
  l.deadline_ms = j.value("deadline_ms", int64_t(0));
  l.ended_ms = j.value("ended_ms", int64_t(0));
  l.free_at_ms = j.value("free_at_ms", int64_t(0));
  l.charged_until_ms = j.value("charged_until_ms", int64_t(0));
  l.gpu_hours = j.value("gpu_hours", 0.0);
  l.preempted_for = j.value("preempted_for", int64_t(0));
  l.waiting_on = j.value("waiting_on", std::vector<int64_t>{});
  l.reason = j.value("reason", "");
  if (j.contains("telemetry")) {
    const json& t = j["telemetry"];
    l.telemetry.step = t.value("step", int64_t(-1));
    l.telemetry.epoch = t.value("epoch", -1);
    l.telemetry.gpu_util = t.value("gpu_util", -1.0);
    l.telemetry.memory_used_gib = t.value("memory_used_gib", -1.0);
    l.telemetry.last_checkpoint_ms = t.value("last_checkpoint_ms", int64_t(0));
  }
  return l;
}

Approval approval_from_json(const json& j) {
  Approval a;
  a.id = j.at("id").get<int64_t>();
  a.lease_id = j.value("lease_id", int64_t(0));
  a.team = j.value("team", "");
  a.user = j.value("user", "");
  a.model = j.value("model", "");
  a.justification = j.value("justification", "");
  a.state = j.value("state", "pending");
  a.decided_by = j.value("decided_by", "");
  a.note = j.value("note", "");
  a.created_ms = j.value("created_ms", int64_t(0));
  a.decided_ms = j.value("decided_ms", int64_t(0));
  return a;
}

}  // namespace yolo8::quota
