#pragma once
// Grant receipts: what quotad signs when it grants a lease, so that a trainer whose lease a restored database lacks
// (granted after the backup it was restored from) can have it re-admitted with its id and GPUs (Engine::reattach).
// HMAC-SHA256 (OpenSSL) under a per-database secret (StateStore::receipt_key) over a canonical encoding of the
// grant's facts; no I/O.
#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "quota/core/cluster_state.h"

namespace yolo8::quota {

// The length of a receipt key in bytes (a random secret created once per database).
inline constexpr size_t kReceiptKeyBytes = 32;

struct LeaseReceipt {
  int64_t lease_id = 0;
  std::string team;
  std::string user;
  std::string job;
  std::string model;
  std::string priority;  // to_string(Priority)
  bool preemptible = true;
  bool shared = false;
  double memory_gib = 0;             // per GPU: the share of a shared lease, else its GPUs' memory
  std::vector<std::string> devices;  // "node:index", as the inventory names the GPUs
  int64_t granted_ms = 0;
  int ttl_s = 0;          // the heartbeat ttl the lease was granted under
  std::string signature;  // lower-case hex HMAC-SHA256 of canonical_receipt()
};

// The signed text: a JSON array of the facts in a fixed order (memory in whole MiB, so that it survives a JSON
// round trip bit for bit). Changing it invalidates every receipt handed out: a new version string then.
std::string canonical_receipt(const LeaseReceipt& receipt);
// Lower-case hex HMAC-SHA256 of the canonical text under `key` (raw bytes). Throws std::invalid_argument for an
// empty key.
std::string receipt_signature(const LeaseReceipt& receipt, const std::string& key);
// Whether the receipt's signature is the one `key` makes (compared in constant time).
bool receipt_verifies(const LeaseReceipt& receipt, const std::string& key);
// The signed receipt of a granted lease (its devices named as `policy` names them).
LeaseReceipt receipt_of(const Lease& lease, const Policy& policy, const std::string& key);

nlohmann::json to_json(const LeaseReceipt& receipt);
// Throws RequestError naming the field when a field is missing or has the wrong type.
LeaseReceipt receipt_from_json(const nlohmann::json& body);

// A fresh random key of kReceiptKeyBytes (OpenSSL's RAND_bytes), hex-encoded for storage; key_from_hex decodes it
// (std::invalid_argument naming the text's problem).
std::string new_receipt_key_hex();
std::string key_from_hex(const std::string& hex);

}  // namespace yolo8::quota
