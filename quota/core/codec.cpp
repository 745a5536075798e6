#include "quota/core/codec.h"

#include <cstdio>
#include <set>
#include <vector>

namespace yolo8::quota {

using nlohmann::json;

void check_text(const std::string& field_name, const std::string& text, bool free_text) {
  for (const char ch : text) {
    const auto code = static_cast<unsigned char>(ch);
    if (code >= 0x20 && code != 0x7f) continue;
    if (free_text && (ch == '\n' || ch == '\t')) continue;
    char hex[8];
    std::snprintf(hex, sizeof(hex), "0x%02x", code);
    throw RequestError(field_name + ": contains the control character " + hex +
                       (free_text ? " (only line feeds and tabs are allowed)" : ""));
  }
}

nlohmann::json parse_request_body(const std::string& body) {
  if (body.empty()) return json::object();
  if (body.rfind("\xEF\xBB\xBF", 0) == 0) {
    throw RequestError("body: starts with a byte-order mark; send JSON without one (RFC 8259)");
  }
  // The keys seen so far in each open object, innermost last.
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  const json::parser_callback_t no_duplicates = [&](int /*depth*/, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::object_start) {
      open_objects.emplace_back();
    } else if (event == json::parse_event_t::object_end) {
      if (!open_objects.empty()) open_objects.pop_back();
    } else if (event == json::parse_event_t::key && !open_objects.empty() && duplicate.empty() &&
               !open_objects.back().insert(parsed.get<std::string>()).second) {
      duplicate = parsed.get<std::string>();
    }
    return true;
  };
  json parsed;
  try {
    parsed = json::parse(body, no_duplicates);
  } catch (const json::parse_error&) {
    throw RequestError("body: malformed JSON");
  }
  if (!duplicate.empty()) throw RequestError("body: the key '" + duplicate + "' appears twice in one object");
  return parsed;
}

namespace {

template <typename T>
T field(const json& object, const char* key, T fallback) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return fallback;
  try {
    if constexpr (std::is_same_v<T, bool>) {
      if (!it->is_boolean()) throw RequestError("");
    } else if constexpr (std::is_arithmetic_v<T>) {
      if (!it->is_number()) throw RequestError("");
      if constexpr (std::is_integral_v<T>) {
        // whole numbers only, and within the range a double holds exactly
        const double number = it->get<double>();
        if (number != static_cast<double>(static_cast<int64_t>(number)) || number < -9e15 || number > 9e15) {
          throw RequestError("");
        }
      }
    } else {
      if (!it->is_string()) throw RequestError("");
    }
    return it->get<T>();
  } catch (const std::exception&) {
    throw RequestError(std::string(key) + ": has the wrong type");
  }
}

// `free_text`: line feeds and tabs are allowed (a justification may have paragraphs); NUL and every other
// control character are refused, in identifiers all of them, so nothing is cut or smuggled into the audit.
std::string bounded(const json& object, const char* key, size_t max_len, const std::string& fallback = "",
                    bool free_text = false) {
  std::string text = field<std::string>(object, key, fallback);
  if (text.size() > max_len) {
    throw RequestError(std::string(key) + ": longer than " + std::to_string(max_len) + " characters");
  }
  check_text(key, text, free_text);
  return text;
}

int bounded_int(const json& object, const char* key, int fallback) {
  const int64_t number = field<int64_t>(object, key, fallback);
  if (number < -1000000 || number > 1000000) throw RequestError(std::string(key) + ": out of range");
  return static_cast<int>(number);
}

}  // namespace

json to_json(const LeaseRequest& request) {
  json out{{"team", request.team},
           {"user", request.user},
           {"job", request.job},
           {"model", request.model},
           {"imgsz", request.imgsz},
           {"batch", request.batch},
           {"gpus", request.gpus},
           {"max_gpus", request.max_gpus},
           {"memory_gib", request.memory_gib},
           {"priority", to_string(request.priority)},
           {"preemptible", request.preemptible},
           {"shared", request.shared},
           {"justification", request.justification},
           {"idempotency_key", request.idempotency_key}};
  if (!request.requested_by.empty()) out["requested_by"] = request.requested_by;
  if (!request.node.empty()) out["node"] = request.node;
  if (!request.visible_devices.empty()) out["visible_devices"] = request.visible_devices;
  if (!request.node_gpus.empty()) out["node_gpus"] = request.node_gpus;
  return out;
}

json to_json(const Telemetry& telemetry) {
  json out{{"step", telemetry.step},
           {"epoch", telemetry.epoch},
           {"gpu_util", telemetry.gpu_util},
           {"memory_used_gib", telemetry.memory_used_gib},
           {"last_checkpoint_ms", telemetry.last_checkpoint_ms}};
  if (!telemetry.gpu_util_source.empty()) out["gpu_util_source"] = telemetry.gpu_util_source;
  if (telemetry.device_memory_used_gib >= 0) out["device_memory_used_gib"] = telemetry.device_memory_used_gib;
  if (telemetry.process_memory_used_gib >= 0) out["process_memory_used_gib"] = telemetry.process_memory_used_gib;
  if (!telemetry.model.empty()) out["model"] = telemetry.model;
  if (telemetry.imgsz > 0) out["imgsz"] = telemetry.imgsz;
  if (telemetry.batch > 0) out["batch"] = telemetry.batch;
  if (telemetry.amp >= 0) out["amp"] = telemetry.amp == 1;
  if (!telemetry.device_name.empty()) out["device_name"] = telemetry.device_name;
  if (!telemetry.libtorch.empty()) out["libtorch"] = telemetry.libtorch;
  return out;
}

json to_json(const Lease& lease, const Policy& policy) {
  json devices = json::array();
  for (const int device : lease.devices) {
    const bool known = device >= 0 && static_cast<size_t>(device) < policy.gpus.size();
    devices.push_back(known ? policy.gpus[static_cast<size_t>(device)].id() : std::to_string(device));
  }
  return json{{"id", lease.id},
              {"request", to_json(lease.req)},
              {"state", to_string(lease.state)},
              {"outcome", to_string(lease.outcome)},
              {"gpus", lease.gpus},
              {"memory_gib", lease.memory_gib},
              {"shared", lease.shared},
              {"device_index", lease.devices},
              {"devices", devices},
              {"over_base", lease.over_base},
              {"extra_gpus", lease.extra_gpus},
              {"emergency", lease.emergency},
              {"review_pending", lease.review_pending},
              {"approval_id", lease.approval_id},
              {"created_ms", lease.created_ms},
              {"granted_ms", lease.granted_ms},
              {"last_seen_ms", lease.last_seen_ms},
              {"heartbeat_clock_ms", lease.heartbeat_clock_ms},
              {"deadline_ms", lease.deadline_ms},
              {"ended_ms", lease.ended_ms},
              {"free_at_ms", lease.free_at_ms},
              {"charged_until_ms", lease.charged_until_ms},
              {"gpu_hours", lease.gpu_hours},
              {"preempted_for", lease.preempted_for},
              {"waiting_on", lease.waiting_on},
              {"reason", lease.reason},
              {"telemetry", to_json(lease.telemetry)}};
}

json to_json(const Approval& approval) {
  return json{{"id", approval.id},
              {"lease_id", approval.lease_id},
              {"team", approval.team},
              {"user", approval.user},
              {"model", approval.model},
              {"justification", approval.justification},
              {"state", to_string(approval.state)},
              {"decided_by", approval.decided_by},
              {"note", approval.note},
              {"created_ms", approval.created_ms},
              {"decided_ms", approval.decided_ms}};
}

json to_json(const AuditEntry& entry) {
  return json{{"seq", entry.seq},           {"ts_ms", entry.ts_ms}, {"actor", entry.actor},  {"action", entry.action},
              {"lease_id", entry.lease_id}, {"team", entry.team},   {"detail", entry.detail}};
}

json to_json(const EngineState& state, const Policy& policy) {
  json leases = json::array();
  for (const auto& [id, lease] : state.leases) {
    json record = to_json(lease, policy);
    record["device_ids"] = lease.device_ids;
    leases.push_back(std::move(record));
  }
  json approvals = json::array();
  for (const auto& [id, approval] : state.approvals) approvals.push_back(to_json(approval));
  json audit = json::array();
  for (const auto& entry : state.audit) audit.push_back(to_json(entry));
  json usage = json::array();
  for (const auto& [key, hours] : state.usage) usage.push_back(json{key.first, key.second, hours});
  json idempotency = json::array();
  for (const auto& [key, lease_id] : state.idempotency) idempotency.push_back(json{key.first, key.second, lease_id});
  json loans = json::array();
  for (const auto& [id, loan] : state.loans) loans.push_back(to_json(loan));
  json grants = json::array();
  for (const auto& [id, grant] : state.grants) grants.push_back(to_json(grant));
  json fair_usage = json::object();
  for (const auto& [key, decayed] : state.fair_usage) fair_usage[key] = json{decayed.value, decayed.as_of_ms};
  const Changes& changes = state.changes;
  json changed_audit = json::array();
  for (const auto& entry : changes.audit) changed_audit.push_back(to_json(entry));
  json quarantined = json::array();
  for (const auto& [id, why] : changes.quarantined) quarantined.push_back(json{id, why.why, why.at_ms});
  return json{
      {"leases", leases},
      {"approvals", approvals},
      {"audit", audit},
      {"usage", usage},
      {"idempotency", idempotency},
      {"loans", loans},
      {"grants", grants},
      {"next", {state.next_lease, state.next_approval, state.next_audit_seq, state.next_loan, state.next_grant}},
      {"queue", state.queue},
      {"queue_index", state.queue_index},
      {"fair_usage", fair_usage},
      {"changes",
       {{"leases", changes.leases},
        {"approvals", changes.approvals},
        {"audit", changed_audit},
        {"usage", changes.usage},
        {"loans", changes.loans},
        {"grants", changes.grants},
        {"quarantined", quarantined}}}};
}

LeaseRequest lease_request_from_json(const json& body) {
  if (!body.is_object()) throw RequestError("body: must be a JSON object");
  LeaseRequest request;
  request.team = bounded(body, "team", 128);
  request.user = bounded(body, "user", 128);
  request.job = bounded(body, "job", 256, "", true);  // shown escaped (metrics, pages): a line feed is harmless
  request.model = bounded(body, "model", 256, "yolov8n");
  request.imgsz = bounded_int(body, "imgsz", 640);
  auto batch = body.find("batch");
  if (batch != body.end() && batch->is_string()) {
    if (*batch != "auto") throw RequestError("batch: must be a number or \"auto\"");
    request.batch = 0;
  } else {
    request.batch = bounded_int(body, "batch", 0);
  }
  request.gpus = bounded_int(body, "gpus", 0);
  request.max_gpus = bounded_int(body, "max_gpus", 0);
  request.memory_gib = field<double>(body, "memory_gib", 0);
  try {
    request.priority = parse_priority(field<std::string>(body, "priority", "normal"));
  } catch (const PolicyError& error) {
    throw RequestError(error.what());
  }
  request.preemptible = field<bool>(body, "preemptible", true);
  request.shared = field<bool>(body, "shared", false);
  request.justification = bounded(body, "justification", 2000, "", true);
  request.idempotency_key = bounded(body, "idempotency_key", 128);
  request.node = bounded(body, "node", 253);  // a Kubernetes node name
  if (auto devices = body.find("visible_devices"); devices != body.end() && !devices->is_null()) {
    if (!devices->is_array() || devices->size() > 64) {
      throw RequestError("visible_devices: must be a list of at most 64 GPU UUIDs");
    }
    for (const auto& device : *devices) {
      if (!device.is_string()) throw RequestError("visible_devices: must be a list of GPU UUIDs (text)");
      const json one{{"visible_devices", device}};
      request.visible_devices.push_back(bounded(one, "visible_devices", 128));
    }
  }
  if (auto gpus = body.find("node_gpus"); gpus != body.end() && !gpus->is_null()) {
    if (!gpus->is_array() || gpus->size() > 64)
      throw RequestError("node_gpus: must be a list of at most 64 GPU indices");
    for (const auto& index : *gpus) {
      if (!index.is_number_integer() || index.get<int64_t>() < 0 || index.get<int64_t>() > 1023) {
        throw RequestError("node_gpus: must be GPU indices of the node (0..1023)");
      }
      request.node_gpus.push_back(index.get<int>());
    }
  }
  return request;
}

Telemetry telemetry_from_json(const json& body) {
  Telemetry telemetry;
  if (body.is_null()) return telemetry;
  if (!body.is_object()) throw RequestError("body: must be a JSON object");
  telemetry.step = field<int64_t>(body, "step", -1);
  telemetry.epoch = bounded_int(body, "epoch", -1);
  telemetry.gpu_util = field<double>(body, "gpu_util", -1);
  telemetry.memory_used_gib = field<double>(body, "memory_used_gib", -1);
  telemetry.last_checkpoint_ms = field<int64_t>(body, "last_checkpoint_ms", 0);
  telemetry.gpu_util_source = bounded(body, "gpu_util_source", 16);
  telemetry.device_memory_used_gib = field<double>(body, "device_memory_used_gib", -1);
  telemetry.process_memory_used_gib = field<double>(body, "process_memory_used_gib", -1);
  if (telemetry.gpu_util > 1.0 + 1e-9) throw RequestError("gpu_util: a fraction within 0..1");
  if (!telemetry.gpu_util_source.empty() && telemetry.gpu_util_source != "nvml" &&
      telemetry.gpu_util_source != "busy_time") {
    throw RequestError("gpu_util_source: expected nvml or busy_time, got '" + telemetry.gpu_util_source + "'");
  }
  telemetry.model = bounded(body, "model", 128);
  telemetry.imgsz = bounded_int(body, "imgsz", -1);
  telemetry.batch = bounded_int(body, "batch", -1);
  if (body.contains("amp") && !body["amp"].is_null()) {
    if (!body["amp"].is_boolean()) throw RequestError("amp: must be true or false");
    telemetry.amp = body["amp"].get<bool>() ? 1 : 0;
  }
  telemetry.device_name = bounded(body, "device_name", 128);
  telemetry.libtorch = bounded(body, "libtorch", 64);
  return telemetry;
}

Lease lease_from_json(const json& record) {
  Lease lease;
  lease.id = record.at("id").get<int64_t>();
  const json& request = record.at("request");
  lease.req.team = request.value("team", "");
  lease.req.user = request.value("user", "");
  lease.req.job = request.value("job", "");
  lease.req.model = request.value("model", "");
  lease.req.imgsz = request.value("imgsz", 640);
  lease.req.batch = request.value("batch", 0);
  lease.req.gpus = request.value("gpus", 0);
  lease.req.max_gpus = request.value("max_gpus", 0);
  lease.req.memory_gib = request.value("memory_gib", 0.0);
  try {
    lease.req.priority = parse_priority(request.value("priority", "normal"));
  } catch (const PolicyError& error) {
    throw PolicyError(std::string("request.") + error.what());
  }
  lease.req.preemptible = request.value("preemptible", true);
  lease.req.shared = request.value("shared", false);
  lease.req.justification = request.value("justification", "");
  lease.req.idempotency_key = request.value("idempotency_key", "");
  lease.req.requested_by = request.value("requested_by", "");
  lease.req.node = request.value("node", "");
  lease.req.visible_devices = request.value("visible_devices", std::vector<std::string>{});
  lease.req.node_gpus = request.value("node_gpus", std::vector<int>{});
  lease.state = parse_lease_state(record.at("state").get<std::string>());
  lease.outcome = parse_outcome(record.value("outcome", ""));
  lease.gpus = record.value("gpus", 1);
  lease.memory_gib = record.value("memory_gib", 0.0);
  lease.shared = record.value("shared", false);
  lease.devices = record.value("device_index", std::vector<int>{});
  lease.device_ids = record.value("devices", std::vector<std::string>{});
  lease.over_base = record.value("over_base", false);
  lease.extra_gpus = record.value("extra_gpus", 0);
  lease.emergency = record.value("emergency", false);
  lease.review_pending = record.value("review_pending", false);
  lease.approval_id = record.value("approval_id", int64_t{0});
  lease.created_ms = record.value("created_ms", int64_t{0});
  lease.granted_ms = record.value("granted_ms", int64_t{0});
  lease.last_seen_ms = record.value("last_seen_ms", int64_t{0});
  lease.heartbeat_clock_ms = record.value("heartbeat_clock_ms", int64_t{0});  // rows of an older quotad: none
  lease.deadline_ms = record.value("deadline_ms", int64_t{0});
  lease.ended_ms = record.value("ended_ms", int64_t{0});
  lease.free_at_ms = record.value("free_at_ms", int64_t{0});
  lease.charged_until_ms = record.value("charged_until_ms", int64_t{0});
  lease.gpu_hours = record.value("gpu_hours", 0.0);
  lease.preempted_for = record.value("preempted_for", int64_t{0});
  lease.waiting_on = record.value("waiting_on", std::vector<int64_t>{});
  lease.reason = record.value("reason", "");
  if (record.contains("telemetry")) {
    const json& telemetry = record["telemetry"];
    lease.telemetry.step = telemetry.value("step", int64_t{-1});
    lease.telemetry.epoch = telemetry.value("epoch", -1);
    lease.telemetry.gpu_util = telemetry.value("gpu_util", -1.0);
    lease.telemetry.memory_used_gib = telemetry.value("memory_used_gib", -1.0);
    lease.telemetry.gpu_util_source = telemetry.value("gpu_util_source", "");
    lease.telemetry.device_memory_used_gib = telemetry.value("device_memory_used_gib", -1.0);
    lease.telemetry.process_memory_used_gib = telemetry.value("process_memory_used_gib", -1.0);
    lease.telemetry.last_checkpoint_ms = telemetry.value("last_checkpoint_ms", int64_t{0});
    // what the peak was measured with: written by to_json, so a restart keeps it (the journal's advice and the
    // learned memory table read it)
    lease.telemetry.model = telemetry.value("model", "");
    lease.telemetry.imgsz = telemetry.value("imgsz", -1);
    lease.telemetry.batch = telemetry.value("batch", -1);
    if (telemetry.contains("amp") && telemetry["amp"].is_boolean()) lease.telemetry.amp = telemetry["amp"].get<bool>();
    lease.telemetry.device_name = telemetry.value("device_name", "");
    lease.telemetry.libtorch = telemetry.value("libtorch", "");
  }
  return lease;
}

Approval approval_from_json(const json& record) {
  Approval approval;
  approval.id = record.at("id").get<int64_t>();
  approval.lease_id = record.value("lease_id", int64_t{0});
  approval.team = record.value("team", "");
  approval.user = record.value("user", "");
  approval.model = record.value("model", "");
  approval.justification = record.value("justification", "");
  approval.state = parse_approval_state(record.value("state", "pending"));
  approval.decided_by = record.value("decided_by", "");
  approval.note = record.value("note", "");
  approval.created_ms = record.value("created_ms", int64_t{0});
  approval.decided_ms = record.value("decided_ms", int64_t{0});
  return approval;
}

}  // namespace yolo8::quota
