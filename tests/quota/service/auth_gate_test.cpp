#include "quota/service/auth_gate.h"

#include <gtest/gtest.h>

#include <string>
#include <variant>

#include "tests/quota/quota_test_util.h"

namespace yolo8::quota {
namespace {

using testing::kMinute;
using testing::kMonday;

ApiRequest from(const std::string& address, const std::string& token) {
  ApiRequest req = testing::api_call("GET", "/v1/teams", token);
  req.client_address = address;
  return req;
}

int status_of(const std::variant<Caller, ApiResponse>& verdict) {
  return std::holds_alternative<Caller>(verdict) ? 200 : std::get<ApiResponse>(verdict).status;
}

TEST(AuthGate, AValidTokenNamesItsUser) {
  const Policy policy = testing::example_policy();
  AuthGate gate;
  const auto verdict = gate.authenticate(policy, from("10.0.0.1", "alice-token"), kMonday);
  ASSERT_TRUE(std::holds_alternative<Caller>(verdict));
  EXPECT_EQ(std::get<Caller>(verdict).name, "alice");
  EXPECT_EQ(std::get<Caller>(verdict).team, policy.users.at("alice").team);
  EXPECT_EQ(status_of(gate.authenticate(policy, from("10.0.0.1", ""), kMonday)), 401);
  EXPECT_EQ(status_of(gate.authenticate(policy, from("10.0.0.1", "nobody-token"), kMonday)), 401);
}

// A guesser changing the token every time is slowed by the address's record; a trainer with a valid token behind
// the same address (a proxy, a NAT) is still answered.
TEST(AuthGate, DistinctWrongTokensFromOneAddressMeet429WhileAValidTokenThereIsAnswered) {
  const Policy policy = testing::example_policy();
  AuthGate gate;
  const int64_t now = kMonday;
  int refused = 0;
  for (int i = 0; i < AuthGate::kFreeAddressAuthFailures + 3; ++i) {
    const auto verdict = gate.authenticate(policy, from("10.0.0.9", "guess-" + std::to_string(i)), now);
    const int status = status_of(verdict);
    ASSERT_TRUE(status == 401 || status == 429) << status;
    if (status == 429) {
      ++refused;
      EXPECT_FALSE(std::get<ApiResponse>(verdict).headers.at("Retry-After").empty());
    }
  }
  // each token was new, so only the address's record can have refused them
  EXPECT_GE(refused, 3);
  EXPECT_EQ(status_of(gate.authenticate(policy, from("10.0.0.9", "another-guess"), now)), 429);
  EXPECT_EQ(status_of(gate.authenticate(policy, from("10.0.0.9", "alice-token"), now)), 200);
  // another address is not slowed, and the blocked one is answered again after its back-off
  EXPECT_EQ(status_of(gate.authenticate(policy, from("10.0.0.10", "first-guess"), now)), 401);
  EXPECT_EQ(status_of(gate.authenticate(policy, from("10.0.0.9", "later-guess"), now + 2 * kMinute)), 401);
}

TEST(AuthGate, ARepeatedWrongTokenIsThrottledForItsAddressOnly) {
  const Policy policy = testing::example_policy();
  AuthGate gate;
  const int64_t now = kMonday;
  for (int i = 0; i < AuthGate::kFreeAuthFailures; ++i) {
    EXPECT_EQ(status_of(gate.authenticate(policy, from("10.0.0.2", "stale-token"), now)), 401) << i;
  }
  const auto verdict = gate.authenticate(policy, from("10.0.0.2", "stale-token"), now);
  ASSERT_EQ(status_of(verdict), 429);
  EXPECT_NE(std::get<ApiResponse>(verdict).body["reason"].get<std::string>().find("this token failed too often"),
            std::string::npos);
  EXPECT_EQ(status_of(gate.authenticate(policy, from("10.0.0.3", "stale-token"), now)), 401);
  EXPECT_EQ(status_of(gate.authenticate(policy, from("10.0.0.2", "alice-token"), now)), 200);
}

// Every failed or refused attempt is counted for the audit once; attempts of a tick that was not saved come back.
TEST(AuthGate, AttemptsAreReportedOncePerAddressAndPutBackWhenNotAudited) {
  const Policy policy = testing::example_policy();
  AuthGate gate;
  for (int i = 0; i < 3; ++i) gate.authenticate(policy, from("10.0.0.4", "wrong-" + std::to_string(i)), kMonday);
  gate.authenticate(policy, from("10.0.0.5", "wrong"), kMonday);
  gate.authenticate(policy, from("10.0.0.5", "bob-token"), kMonday);
  const std::map<std::string, int> attempts = gate.take_unreported();
  EXPECT_EQ(attempts, (std::map<std::string, int>{{"10.0.0.4", 3}, {"10.0.0.5", 1}}));
  EXPECT_TRUE(gate.take_unreported().empty());
  gate.put_back_unreported(attempts);
  gate.authenticate(policy, from("10.0.0.4", "wrong-again"), kMonday);
  EXPECT_EQ(gate.take_unreported(), (std::map<std::string, int>{{"10.0.0.4", 4}, {"10.0.0.5", 1}}));
}

TEST(AuthGate, AnInProcessCallerIsTakenAsNamed) {
  const Policy policy = testing::example_policy();
  AuthGate gate;
  ApiRequest req = from("", "");
  req.trusted_user = "alice";
  const auto alice = gate.authenticate(policy, req, kMonday);
  ASSERT_TRUE(std::holds_alternative<Caller>(alice));
  EXPECT_EQ(std::get<Caller>(alice).role, policy.users.at("alice").role);
  req.trusted_user = "ci-runner";  // not in the policy: the workstation's own user acts as an admin
  const auto other = gate.authenticate(policy, req, kMonday);
  ASSERT_TRUE(std::holds_alternative<Caller>(other));
  EXPECT_EQ(std::get<Caller>(other).role, Role::kAdmin);
}

TEST(MayAct, TheHolderALeadOfTheTeamOrAnAdmin) {
  const Caller member{"alice", "team-cv", Role::kMember};
  const Caller lead{"lena", "team-cv", Role::kLead};
  const Caller other_lead{"otto", "team-robotics", Role::kLead};
  const Caller admin{"root", "", Role::kAdmin};
  EXPECT_TRUE(may_act(member, "alice", "team-cv"));
  EXPECT_FALSE(may_act(member, "bob", "team-cv"));
  EXPECT_TRUE(may_act(lead, "bob", "team-cv"));
  EXPECT_FALSE(may_act(other_lead, "bob", "team-cv"));
  EXPECT_TRUE(may_act(admin, "bob", "team-cv"));
}

}  // namespace
}  // namespace yolo8::quota
