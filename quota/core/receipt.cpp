#include "quota/core/receipt.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <stdexcept>

#include "quota/core/codec.h"

namespace yolo8::quota {

using nlohmann::json;

namespace {

constexpr const char* kReceiptVersion = "yolo8-lease-receipt-v1";

std::string hex_of(const unsigned char* bytes, size_t size) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(size * 2);
  for (size_t i = 0; i < size; ++i) {
    out += kDigits[bytes[i] >> 4];
    out += kDigits[bytes[i] & 0xf];
  }
  return out;
}

template <typename T>
T field(const json& body, const char* name) {
  if (!body.contains(name)) throw RequestError(std::string("receipt.") + name + ": required");
  try {
    return body.at(name).get<T>();
  } catch (const json::exception&) {
    throw RequestError(std::string("receipt.") + name + ": has the wrong type");
  }
}

}  // namespace

std::string canonical_receipt(const LeaseReceipt& receipt) {
  const json facts = {
      kReceiptVersion, receipt.lease_id,   receipt.team,        receipt.user,   receipt.job,
      receipt.model,   receipt.priority,   receipt.preemptible, receipt.shared, std::llround(receipt.memory_gib * 1024),
      receipt.devices, receipt.granted_ms, receipt.ttl_s};
  return facts.dump();
}

std::string receipt_signature(const LeaseReceipt& receipt, const std::string& key) {
  if (key.empty()) throw std::invalid_argument("receipt key: empty");
  const std::string text = canonical_receipt(receipt);
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), reinterpret_cast<const unsigned char*>(text.data()),
           text.size(), mac, &size) == nullptr) {
    throw std::runtime_error("receipt: HMAC-SHA256 failed");
  }
  return hex_of(mac, size);
}

bool receipt_verifies(const LeaseReceipt& receipt, const std::string& key) {
  if (key.empty()) return false;
  const std::string expected = receipt_signature(receipt, key);
  return receipt.signature.size() == expected.size() &&
         CRYPTO_memcmp(receipt.signature.data(), expected.data(), expected.size()) == 0;
}

LeaseReceipt receipt_of(const Lease& lease, const Policy& policy, const std::string& key) {
  LeaseReceipt receipt;
  receipt.lease_id = lease.id;
  receipt.team = lease.req.team;
  receipt.user = lease.req.user;
  receipt.job = lease.req.job;
  receipt.model = lease.req.model;
  receipt.priority = to_string(lease.req.priority);
  receipt.preemptible = lease.req.preemptible;
  receipt.shared = lease.shared;
  receipt.memory_gib = lease.memory_gib;
  for (const int device : lease.devices) {
    if (device >= 0 && static_cast<size_t>(device) < policy.gpus.size()) {
      receipt.devices.push_back(policy.gpus[static_cast<size_t>(device)].id());
    }
  }
  receipt.granted_ms = lease.granted_ms;
  receipt.ttl_s = policy.ttl_s;
  receipt.signature = receipt_signature(receipt, key);
  return receipt;
}

json to_json(const LeaseReceipt& receipt) {
  return json{{"lease_id", receipt.lease_id},
              {"team", receipt.team},
              {"user", receipt.user},
              {"job", receipt.job},
              {"model", receipt.model},
              {"priority", receipt.priority},
              {"preemptible", receipt.preemptible},
              {"shared", receipt.shared},
              {"memory_gib", receipt.memory_gib},
              {"devices", receipt.devices},
              {"granted_ms", receipt.granted_ms},
              {"ttl_s", receipt.ttl_s},
              {"signature", receipt.signature}};
}

LeaseReceipt receipt_from_json(const json& body) {
  if (!body.is_object()) throw RequestError("receipt: must be a JSON object");
  LeaseReceipt receipt;
  receipt.lease_id = field<int64_t>(body, "lease_id");
  receipt.team = field<std::string>(body, "team");
  receipt.user = field<std::string>(body, "user");
  receipt.job = field<std::string>(body, "job");
  receipt.model = field<std::string>(body, "model");
  receipt.priority = field<std::string>(body, "priority");
  receipt.preemptible = field<bool>(body, "preemptible");
  receipt.shared = field<bool>(body, "shared");
  receipt.memory_gib = field<double>(body, "memory_gib");
  receipt.devices = field<std::vector<std::string>>(body, "devices");
  receipt.granted_ms = field<int64_t>(body, "granted_ms");
  receipt.ttl_s = field<int>(body, "ttl_s");
  receipt.signature = field<std::string>(body, "signature");
  return receipt;
}

std::string new_receipt_key_hex() {
  unsigned char key[kReceiptKeyBytes];
  if (RAND_bytes(key, sizeof key) != 1) throw std::runtime_error("receipt key: RAND_bytes failed");
  return hex_of(key, sizeof key);
}

std::string key_from_hex(const std::string& hex) {
  if (hex.size() % 2 != 0) throw std::invalid_argument("receipt key: odd number of hex digits");
  std::string out;
  for (size_t i = 0; i < hex.size(); i += 2) {
    const auto digit = [&](char ch) {
      if (ch >= '0' && ch <= '9') return ch - '0';
      if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
      if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
      throw std::invalid_argument("receipt key: not hex");
    };
    out += static_cast<char>(digit(hex[i]) * 16 + digit(hex[i + 1]));
  }
  return out;
}

}  // namespace yolo8::quota
