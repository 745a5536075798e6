#pragma once
// JSON forms of the engine's records, shared by storage, the HTTP API and the client.
#include <nlohmann/json.hpp>

#include <stdexcept>
#include <string>

#include "quota/core/engine.h"

namespace yolo8::quota {

// A request body that is malformed or has a field of the wrong type; the message names the field.
class RequestError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

nlohmann::json to_json(const LeaseRequest& request);
nlohmann::json to_json(const Telemetry& telemetry);
// Full record (storage). `policy` resolves device names.
nlohmann::json to_json(const Lease& lease, const Policy& policy);
nlohmann::json to_json(const Approval& approval);
nlohmann::json to_json(const AuditEntry& entry);
// The engine's whole state, every record with the figures the store keeps (and the stored device ids): two
// states are the same value when these are equal.
nlohmann::json to_json(const EngineState& state, const Policy& policy);

// Refuses (RequestError naming `field_name`) NUL and control characters; `free_text` allows line feeds and tabs.
void check_text(const std::string& field_name, const std::string& text, bool free_text);

// A request body as JSON, strictly: empty is {}, and malformed JSON, a byte-order mark before it and a key twice in
// one object (nlohmann would keep the last silently) throw RequestError naming the body.
nlohmann::json parse_request_body(const std::string& body);

// Strict parsers for client input: unknown fields are ignored, wrong types throw RequestError.
LeaseRequest lease_request_from_json(const nlohmann::json& body);
Telemetry telemetry_from_json(const nlohmann::json& body);

// Storage round trip (our own records). A state, outcome or priority text that is not one of the enum's
// throws PolicyError naming the field ("state: 'paused' is not one of ..."); json errors for missing ids.
Lease lease_from_json(const nlohmann::json& record);
Approval approval_from_json(const nlohmann::json& record);

}  // namespace yolo8::quota
