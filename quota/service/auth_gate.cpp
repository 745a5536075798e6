#include "quota/service/auth_gate.h"

#include <algorithm>
#include <utility>

#include "quota/core/sha256.h"

namespace yolo8::quota {

namespace {

// 429 with Retry-After in whole seconds.
ApiResponse throttled(const std::string& reason, int64_t retry_after_ms) {
  const std::string seconds = std::to_string((retry_after_ms + 999) / 1000);
  ApiResponse response = error_response(429, reason + "; retry in " + seconds + " s");
  response.headers["Retry-After"] = seconds;
  return response;
}

// Bounded memory: every record not blocking now goes (one sweep, not one scan per failure); if all are blocking,
// the one `older` names first.
template <typename Map, typename Older>
void make_room(Map& records, size_t limit, int64_t now_ms, Older older) {
  for (auto it = records.begin(); it != records.end();) {
    it = it->second.blocked_until_ms <= now_ms ? records.erase(it) : std::next(it);
  }
  if (records.size() >= limit) records.erase(std::min_element(records.begin(), records.end(), older));
}

// The back-off once `count` passes `free`: 250 ms, doubling with every further failure, at most a minute.
int64_t blocked_until(int count, int free, int64_t now_ms) {
  const int doublings = std::min(count - free, 8);
  return now_ms + std::min<int64_t>(60000, int64_t{250} << doublings);
}

}  // namespace

bool may_act(const Caller& caller, const std::string& user, const std::string& team) {
  return caller.role == Role::kAdmin || user == caller.name || (caller.role == Role::kLead && team == caller.team);
}

std::variant<Caller, ApiResponse> AuthGate::authenticate(const Policy& policy, const ApiRequest& req, int64_t now_ms) {
  Caller caller;
  if (!req.trusted_user.empty()) {
    caller.name = req.trusted_user;
    if (auto it = policy.users.find(req.trusted_user); it != policy.users.end()) {
      caller.team = it->second.team;
      caller.role = it->second.role;
    } else {
      caller.role = Role::kAdmin;
    }
    return caller;
  }
  if (req.token.empty()) return error_response(401, "authorization: a bearer token is required");
  // Throttled per (address, token): a wrong token repeated from an address shared with trainers (a TLS proxy, a
  // NAT) blocks only that token there. A blocked token was already found wrong (the policy does not change while
  // serving), so it is refused before the users' hashes are computed.
  const std::string key = failure_key(req.client_address, req.token);
  int64_t retry_after_ms = 0;
  if (token_blocked(key, req.client_address, now_ms, retry_after_ms)) {
    return throttled("authorization: this token failed too often from this address", retry_after_ms);
  }
  // the token is checked before the address's record: a valid token is served whatever its address did
  const User* user = policy.find_user_by_token(req.token, now_ms);
  if (user == nullptr) {
    if (address_blocked(req.client_address, now_ms, retry_after_ms)) {
      return throttled("authorization: unknown token, and too many failed authentications from this address",
                       retry_after_ms);
    }
    failed(key, req.client_address, now_ms);
    return error_response(401, "authorization: unknown token");
  }
  caller.name = user->name;
  caller.team = user->team;
  caller.role = user->role;
  return caller;
}

std::map<std::string, int> AuthGate::take_unreported() {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::exchange(unreported_, {});
}

void AuthGate::put_back_unreported(const std::map<std::string, int>& attempts) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& [address, count] : attempts) unreported_[address] += count;
}

std::string AuthGate::failure_key(const std::string& address, const std::string& token) {
  return address + " " + sha256_hex(token);
}

bool AuthGate::token_blocked(const std::string& key, const std::string& address, int64_t now_ms,
                             int64_t& retry_after_ms) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = token_failures_.find(key);
  if (it == token_failures_.end() || now_ms >= it->second.blocked_until_ms) return false;
  retry_after_ms = it->second.blocked_until_ms - now_ms;
  ++unreported_[address];  // refused without a look at the users: still an attempt
  return true;
}

bool AuthGate::address_blocked(const std::string& address, int64_t now_ms, int64_t& retry_after_ms) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = address_failures_.find(address);
  if (it == address_failures_.end() || now_ms >= it->second.blocked_until_ms) return false;
  retry_after_ms = it->second.blocked_until_ms - now_ms;
  ++unreported_[address];
  return true;
}

void AuthGate::failed(const std::string& key, const std::string& address, int64_t now_ms) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++unreported_[address];
  if (token_failures_.size() >= kMaxTrackedFailures && !token_failures_.count(key)) {
    make_room(token_failures_, kMaxTrackedFailures, now_ms, [](const auto& a, const auto& b) {
      return a.second.blocked_until_ms < b.second.blocked_until_ms;  // the block that ends first
    });
  }
  TokenFailures& failures = token_failures_[key];
  ++failures.count;
  if (failures.count >= kFreeAuthFailures) {
    failures.blocked_until_ms = blocked_until(failures.count, kFreeAuthFailures, now_ms);
  }
  if (address_failures_.size() >= kMaxTrackedAddresses && !address_failures_.count(address)) {
    make_room(address_failures_, kMaxTrackedAddresses, now_ms, [](const auto& a, const auto& b) {
      return a.second.last_failure_ms < b.second.last_failure_ms;  // the address that failed longest ago
    });
  }
  AddressFailures& from = address_failures_[address];
  if (now_ms - from.last_failure_ms > kAddressFailuresForgottenAfterMs) from.count = 0;
  from.last_failure_ms = now_ms;
  ++from.count;
  if (from.count >= kFreeAddressAuthFailures) {
    from.blocked_until_ms = blocked_until(from.count, kFreeAddressAuthFailures, now_ms);
  }
}

}  // namespace yolo8::quota
