#pragma once
// The quota API's request and response, independent of the transport: quotad's HTTP front builds them from
// HTTP, the client's local mode passes them in process.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <string>

namespace yolo8::quota {

struct ApiRequest {
  std::string method;  // GET | POST
  std::string path;    // without the query string
  std::map<std::string, std::string> query;
  std::string body;
  std::string token;            // bearer token
  std::string idempotency_key;  // Idempotency-Key header
  std::string trusted_user;     // in-process callers (local mode) act as this user without a token
  std::string client_address;   // the peer address (failed authentication is throttled per address)
};

struct ApiResponse {
  int status = 200;
  nlohmann::json body = nlohmann::json::object();
  std::string text;  // non-JSON bodies (metrics)
  std::string content_type = "application/json";
  std::map<std::string, std::string> headers;  // extra response headers (Retry-After, Allow)
  std::string serialized() const { return text.empty() ? body.dump() : text; }
};

// The error answer every route gives: {"error": status, "reason": reason}.
ApiResponse error_response(int status, const std::string& reason);

// `value` with `digits` decimals ("12.5"), as every message, page and report prints figures; never "-0.0".
std::string fixed_text(double value, int digits = 1);

// UTC milliseconds from the system clock.
int64_t system_now_ms();

}  // namespace yolo8::quota
