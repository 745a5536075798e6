#pragma once
// Who calls: a bearer token checked against the policy's users, and the throttles that slow a client guessing
// tokens without ever blocking a valid token, whoever shares its address.
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <variant>

#include "quota/core/api.h"
#include "quota/core/policy.h"

namespace yolo8::quota {

// The authenticated caller of a request.
struct Caller {
  std::string name;
  std::string team;
  Role role = Role::kMember;
};

// The one rule for acting on a lease of `user` in `team`: the holder, a lead of the team, an admin.
bool may_act(const Caller& caller, const std::string& user, const std::string& team);

class AuthGate {
 public:
  // The caller of `req` under `policy`, or the answer refusing it: 401 without a token or with an unknown one,
  // 429 with Retry-After while its (address, token) or, for a wrong token, its address is throttled. An in-process
  // caller's trusted user is taken as named (an admin unless the policy lists it).
  std::variant<Caller, ApiResponse> authenticate(const Policy& policy, const ApiRequest& req, int64_t now_ms);
  // Failed or refused attempts per client address since the last call, for the audit (one entry per address and
  // tick rather than one per guess).
  std::map<std::string, int> take_unreported();
  // Attempts taken but not audited (the tick was not saved): reported with the next.
  void put_back_unreported(const std::map<std::string, int>& attempts);

  // A client repeating a wrong token: a few are free, then 250 ms, doubling with every failure, at most a minute.
  static constexpr int kFreeAuthFailures = 5;
  // Several clients behind one address (a proxy, a NAT) with a stale or mistyped token each have their own
  // kFreeAuthFailures per token; four of them may fail in full before their address is slowed, then the same
  // back-off as a token's.
  static constexpr int kFreeAddressAuthFailures = 4 * kFreeAuthFailures;
  // an address quiet for this long starts afresh (a typo a day must not add up to a blocked address)
  static constexpr int64_t kAddressFailuresForgottenAfterMs = 10 * 60 * 1000;

 private:
  // Failed authentications of one (address, presented token); a valid token is never recorded here.
  struct TokenFailures {
    int count = 0;  // consecutive failures
    int64_t blocked_until_ms = 0;
  };
  // Failed authentications of one address, whatever the tokens: distinct wrong tokens are each a new key above,
  // so a guesser changing the token every time would never be slowed by those alone.
  struct AddressFailures {
    int count = 0;  // failures outside a block, since the address's last quiet spell
    int64_t blocked_until_ms = 0;
    int64_t last_failure_ms = 0;
  };
  static constexpr size_t kMaxTrackedFailures = 10000;
  static constexpr size_t kMaxTrackedAddresses = 10000;
  // The token throttle's key: the address and a digest of the token (wrong tokens may be typos of real ones).
  static std::string failure_key(const std::string& address, const std::string& token);
  // Whether the key (or, for a token found wrong, the address) is blocked now: counts the attempt and says for
  // how long.
  bool token_blocked(const std::string& key, const std::string& address, int64_t now_ms, int64_t& retry_after_ms);
  bool address_blocked(const std::string& address, int64_t now_ms, int64_t& retry_after_ms);
  void failed(const std::string& key, const std::string& address, int64_t now_ms);

  // Guards the three maps; held only for their updates, never while a token is hashed against the users.
  std::mutex mutex_;
  std::map<std::string, TokenFailures> token_failures_;      // by failure_key()
  std::map<std::string, AddressFailures> address_failures_;  // by client address
  std::map<std::string, int> unreported_;                    // attempts not yet audited, by client address
};

}  // namespace yolo8::quota
