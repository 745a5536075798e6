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

nlohmann::json to_json(const LeaseRequest& r);
nlohmann::json to_json(const Telemetry& t);
// Full record (storage). `policy` resolves device names.
nlohmann::json to_json(const Lease& l, const Policy& policy);
nlohmann::json to_json(const Approval& a);
nlohmann::json to_json(const AuditEntry& a);

// Strict parsers for client input: unknown fields are ignored, wrong types throw RequestError.
LeaseRequest lease_request_from_json(const nlohmann::json& j);
Telemetry telemetry_from_json(const nlohmann::json& j);

// Storage round trip (trusted input).
Lease lease_from_json(const nlohmann::json& j);
Approval approval_from_json(const nlohmann::json& j);

}  // namespace yolo8::quota
