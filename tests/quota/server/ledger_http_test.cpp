// Loopback tests of the ledger's endpoints: loan applications, contribution credits, balances, with
// the hardening rules (authentication, roles, validation, 405, limits, audit) and a restart.
#include <httplib.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>

#include "quota/server/http_server.h"
#include "tests/quota/quota_test_util.h"

namespace yolo8::quota {
namespace {

using nlohmann::json;
using testing::kHour;
using testing::kMonday;

// The example department with loans by application only.
Policy applications_policy() {
  std::ifstream in(testing::example_policy_path());
  std::stringstream text;
  text << in.rdbuf();
  std::string yaml = text.str();
  const std::string credits = "credits: {monthly_gpu_hours: 100, loan_gpu_hours: 20}";
  const size_t at = yaml.find(credits);
  EXPECT_NE(at, std::string::npos);
  yaml.replace(at, credits.size(), "credits: {monthly_gpu_hours: 100, loan_gpu_hours: 20, automatic_loan: false}");
  return load_policy_from_string(yaml, "applications.yaml", std::string(yolo8::test::kSourceDir) + "/configs");
}

struct Answer {
  int status = 0;
  json body;
  std::string allow;
};

Answer call(httplib::Client& client, const std::string& method, const std::string& path, const std::string& token,
            const std::string& body = "") {
  httplib::Headers headers;
  if (!token.empty()) headers.emplace("Authorization", "Bearer " + token);
  httplib::Result result = method == "GET"    ? client.Get(path.c_str(), headers)
                           : method == "POST" ? client.Post(path.c_str(), headers, body, "application/json")
                           : method == "PUT"  ? client.Put(path.c_str(), headers, body, "application/json")
                                              : client.Delete(path.c_str(), headers);
  Answer answer;
  if (!result) return answer;
  answer.status = result->status;
  answer.body = json::parse(result->body, nullptr, false);
  answer.allow = result->get_header_value("Allow");
  return answer;
}

std::string reason(const Answer& answer) { return answer.body.is_object() ? answer.body.value("reason", "") : ""; }

// A quotad on loopback over `db` with a clock the test moves.
struct Quotad {
  std::shared_ptr<std::atomic<int64_t>> now;
  std::unique_ptr<QuotaService> service;
  std::unique_ptr<QuotaServer> server;
  std::unique_ptr<httplib::Client> client;
  int port = 0;
  Quotad(const std::string& db, std::shared_ptr<std::atomic<int64_t>> clock) : now(std::move(clock)) {
    ServiceOptions options;
    options.db_path = db;
    auto shared = now;
    options.clock = [shared] { return shared->load(); };
    service = std::make_unique<QuotaService>(applications_policy(), options);
    server = std::make_unique<QuotaServer>(*service, ServerOptions{});
    port = server->start();
    client = std::make_unique<httplib::Client>("127.0.0.1", port);
  }
  ~Quotad() { server->stop(); }
};

bool audited(httplib::Client& client, const std::string& action, const std::string& actor) {
  const Answer log = call(client, "GET", "/v1/audit?limit=1000", "admin-token");
  for (const auto& entry : log.body["audit"]) {
    if (entry["action"] == action && entry["actor"] == actor) return true;
  }
  return false;
}

TEST(QuotaLedgerHttp, LoanAppliedApprovedByTheLeadRepaidAndSurvivingRestarts) {
  const std::string db = testing::temp_db("ledger_http");
  auto clock = std::make_shared<std::atomic<int64_t>>(kMonday + 9 * kHour);
  int64_t loan_id = 0;
  {
    Quotad quotad(db, clock);
    httplib::Client& c = *quotad.client;
    Answer applied = call(c, "POST", "/v1/loans", "alice-token",
                          R"({"amount_gpu_hours": 20, "justification": "rebuttal experiments"})");
    ASSERT_EQ(applied.status, 201) << applied.body.dump();
    loan_id = applied.body["id"].get<int64_t>();
    EXPECT_EQ(applied.body["state"], "pending");
    const std::string approve = "/v1/loans/" + std::to_string(loan_id) + "/approve";
    Answer own = call(c, "POST", approve, "alice-token", "{}");
    EXPECT_EQ(own.status, 403);
    EXPECT_NE(reason(own).find("role:"), std::string::npos) << reason(own);
    EXPECT_EQ(call(c, "POST", approve, "bob-token", "{}").status, 403);   // a member of the team
    EXPECT_EQ(call(c, "POST", approve, "dave-token", "{}").status, 403);  // the lead of another team
    // bob sees neither alice's loan nor her balance; carol (her lead) sees both
    EXPECT_EQ(call(c, "GET", "/v1/loans/" + std::to_string(loan_id), "bob-token").status, 403);
    EXPECT_EQ(call(c, "GET", "/v1/loans", "bob-token").body["loans"].size(), 0u);
    EXPECT_EQ(call(c, "GET", "/v1/balance?user=alice", "bob-token").status, 403);
    Answer decided = call(c, "POST", approve, "carol-token", R"({"note": "ok"})");
    ASSERT_EQ(decided.status, 200) << decided.body.dump();
    EXPECT_EQ(decided.body["state"], "approved");
    EXPECT_EQ(decided.body["decided_by"], "carol");
    EXPECT_EQ(call(c, "POST", approve, "admin-token", "{}").status, 409);
    Answer balance = call(c, "GET", "/v1/balance?user=alice", "carol-token");
    ASSERT_EQ(balance.status, 200);
    EXPECT_DOUBLE_EQ(balance.body["allowance_gpu_hours"].get<double>(), 120.0);
    EXPECT_DOUBLE_EQ(balance.body["loans_gpu_hours"].get<double>(), 20.0);
    EXPECT_TRUE(audited(c, "loan.requested", "alice"));
    EXPECT_TRUE(audited(c, "loan.approved", "carol"));
  }
  {
    // restart: the loan and its effect on the balance are still there
    Quotad quotad(db, clock);
    httplib::Client& c = *quotad.client;
    Answer loan = call(c, "GET", "/v1/loans/" + std::to_string(loan_id), "alice-token");
    ASSERT_EQ(loan.status, 200);
    EXPECT_EQ(loan.body["state"], "approved");
    EXPECT_DOUBLE_EQ(call(c, "GET", "/v1/balance", "alice-token").body["allowance_gpu_hours"].get<double>(), 120.0);
    // the next application gets a fresh id
    Answer next =
        call(c, "POST", "/v1/loans", "alice-token", R"({"amount_gpu_hours": 5, "justification": "one more run"})");
    ASSERT_EQ(next.status, 201);
    EXPECT_GT(next.body["id"].get<int64_t>(), loan_id);
    // the month ends: the approved loan is settled (nothing used: 0 repaid), the pending one expires
    clock->store(kMonday + 24 * kHour + 1000);
    quotad.service->tick();
  }
  {
    Quotad quotad(db, clock);
    httplib::Client& c = *quotad.client;
    Answer loans = call(c, "GET", "/v1/loans", "admin-token");
    ASSERT_EQ(loans.body["loans"].size(), 2u);
    EXPECT_EQ(loans.body["loans"][0]["state"], "repaid");
    EXPECT_EQ(loans.body["loans"][0]["repaid_in"], "2026-12");
    EXPECT_EQ(loans.body["loans"][1]["state"], "expired");
    EXPECT_TRUE(audited(c, "loan.repaid", "quotad"));
    EXPECT_TRUE(audited(c, "loan.expired", "quotad"));
  }
}

TEST(QuotaLedgerHttp, HardeningRulesForEveryLedgerEndpoint) {
  const std::string db = testing::temp_db("ledger_hardening");
  auto clock = std::make_shared<std::atomic<int64_t>>(kMonday + 9 * kHour);
  Quotad quotad(db, clock);
  httplib::Client& c = *quotad.client;
  // authentication
  for (const auto& path : {"/v1/loans", "/v1/credits", "/v1/balance"}) {
    EXPECT_EQ(call(c, "GET", path, "").status, 401) << path;
    EXPECT_EQ(call(c, "GET", path, "wrong").status, 401) << path;
  }
  // other methods: 405 with Allow
  Answer put = call(c, "PUT", "/v1/loans", "alice-token", "{}");
  EXPECT_EQ(put.status, 405);
  EXPECT_EQ(put.allow, "GET, POST");
  EXPECT_EQ(call(c, "DELETE", "/v1/loans/1", "alice-token").allow, "GET");
  EXPECT_EQ(call(c, "GET", "/v1/loans/1/approve", "carol-token").status, 405);
  EXPECT_EQ(call(c, "DELETE", "/v1/credits", "admin-token").allow, "GET, POST");
  EXPECT_EQ(call(c, "POST", "/v1/balance", "alice-token", "{}").allow, "GET");
  // validation, each error naming the field
  const std::pair<std::string, std::string> bad_loans[] = {
      {R"({"amount_gpu_hours": "20", "justification": "x"})", "amount_gpu_hours"},
      {R"({"amount_gpu_hours": true, "justification": "x"})", "amount_gpu_hours"},
      {R"({"amount_gpu_hours": -1, "justification": "x"})", "amount_gpu_hours"},
      {R"({"amount_gpu_hours": 0, "justification": "x"})", "amount_gpu_hours"},
      {R"({"justification": "x"})", "amount_gpu_hours"},
      {R"({"amount_gpu_hours": 5})", "justification"},
      {R"({"amount_gpu_hours": 5, "justification": "a\u0007b"})", "justification"},
      {R"({"amount_gpu_hours": 5, "justification": 7})", "justification"},
      {R"({"amount_gpu_hours": 5, "justification": ")" + std::string(2001, 'x') + R"("})", "justification"},
      {R"([1, 2])", "body"},
      {R"({"amount_gpu_hours": 1e999, "justification": "x"})", "body"},
  };
  for (const auto& [body, field] : bad_loans) {
    const Answer answer = call(c, "POST", "/v1/loans", "alice-token", body);
    EXPECT_EQ(answer.status, 400) << body.substr(0, 80);
    EXPECT_EQ(reason(answer).rfind(field, 0), 0u) << body.substr(0, 80) << " -> " << reason(answer);
  }
  EXPECT_EQ(call(c, "POST", "/v1/loans", "alice-token", R"({"amount_gpu_hours": 5, "justification": "x",
      "user": "bob"})")
                .status,
            403);
  // a retried application with the same Idempotency-Key is the same loan, not a second one
  httplib::Headers keyed = {{"Authorization", "Bearer erin-token"}, {"Idempotency-Key", "retry-1"}};
  auto first = c.Post("/v1/loans", keyed, R"({"amount_gpu_hours": 5, "justification": "x"})", "application/json");
  auto again = c.Post("/v1/loans", keyed, R"({"amount_gpu_hours": 5, "justification": "x"})", "application/json");
  ASSERT_TRUE(first && again);
  EXPECT_EQ(first->status, 201);
  EXPECT_EQ(again->status, 200);
  EXPECT_EQ(json::parse(again->body)["id"], json::parse(first->body)["id"]);
  EXPECT_TRUE(json::parse(again->body)["replayed"].get<bool>());
  EXPECT_EQ(call(c, "GET", "/v1/loans", "erin-token").body["loans"].size(), 1u);
  // limits: 2 applications and 50 GPU-hours per member and month
  EXPECT_EQ(call(c, "POST", "/v1/loans", "bob-token", R"({"amount_gpu_hours": 60, "justification": "x"})").status, 429);
  EXPECT_EQ(call(c, "POST", "/v1/loans", "bob-token", R"({"amount_gpu_hours": 10, "justification": "x"})").status, 201);
  EXPECT_EQ(call(c, "POST", "/v1/loans", "bob-token", R"({"amount_gpu_hours": 10, "justification": "y"})").status, 201);
  const Answer third = call(c, "POST", "/v1/loans", "bob-token", R"({"amount_gpu_hours": 1, "justification": "z"})");
  EXPECT_EQ(third.status, 429);
  EXPECT_NE(reason(third).find("credits.loan_applications_per_month"), std::string::npos) << reason(third);
  EXPECT_EQ(call(c, "GET", "/v1/loans?state=forgiven", "bob-token").status, 400);
  EXPECT_EQ(call(c, "GET", "/v1/loans/abc", "bob-token").status, 404);
  EXPECT_EQ(call(c, "GET", "/v1/loans/999", "bob-token").status, 404);
  EXPECT_EQ(call(c, "GET", "/v1/balance?month=2026-13", "bob-token").status, 400);

  // contribution credits: leads and admins grant, never to themselves, with a reason, within the quarter's cap
  const std::string grant = R"({"user": "alice", "amount_gpu_hours": 30, "reason": "shared augmentation library"})";
  EXPECT_EQ(call(c, "POST", "/v1/credits", "alice-token", grant).status, 403);
  EXPECT_EQ(call(c, "POST", "/v1/credits", "bob-token", grant).status, 403);
  EXPECT_EQ(call(c, "POST", "/v1/credits", "dave-token", grant).status, 403);
  EXPECT_EQ(
      call(c, "POST", "/v1/credits", "carol-token", R"({"user": "carol", "amount_gpu_hours": 5, "reason": "mine"})")
          .status,
      403);
  const Answer no_reason = call(c, "POST", "/v1/credits", "carol-token", R"({"user": "alice", "amount_gpu_hours": 5})");
  EXPECT_EQ(no_reason.status, 400);
  EXPECT_EQ(reason(no_reason).rfind("reason", 0), 0u) << reason(no_reason);
  const Answer granted = call(c, "POST", "/v1/credits", "carol-token", grant);
  ASSERT_EQ(granted.status, 201) << granted.body.dump();
  EXPECT_EQ(granted.body["quarter"], "2026-Q4");
  EXPECT_EQ(call(c, "POST", "/v1/credits", "admin-token", grant).status, 429);  // 60 > 50 this quarter
  const Answer balance = call(c, "GET", "/v1/balance", "alice-token");
  EXPECT_DOUBLE_EQ(balance.body["grants_gpu_hours"].get<double>(), 30.0);
  EXPECT_DOUBLE_EQ(balance.body["allowance_gpu_hours"].get<double>(), 130.0);
  EXPECT_EQ(call(c, "GET", "/v1/credits", "alice-token").body["grants"].size(), 1u);
  EXPECT_EQ(call(c, "GET", "/v1/credits", "erin-token").body["grants"].size(), 0u);
  EXPECT_TRUE(audited(c, "credit.granted", "carol"));
  // a lead's audit view includes the team's ledger entries
  const Answer team_log = call(c, "GET", "/v1/audit", "carol-token");
  bool seen = false;
  for (const auto& entry : team_log.body["audit"]) seen = seen || entry["action"] == "credit.granted";
  EXPECT_TRUE(seen);
  std::vector<std::string> errors = quotad.service->check_invariants();
  EXPECT_TRUE(errors.empty()) << errors.front();
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(QuotaLedgerHttp, CommandLineVerbs) {
  const std::string db = testing::temp_db("ledger_cli");
  auto clock = std::make_shared<std::atomic<int64_t>>(kMonday + 9 * kHour);
  Quotad quotad(db, clock);
  const std::string bin = std::string(yolo8::test::kBinaryDir) + "/quota/quotad";
  const std::string server = " --server http://127.0.0.1:" + std::to_string(quotad.port);
  const std::string out = db + ".out", err = db + ".err";
  auto run = [&](const std::string& args, const std::string& token) {
    return std::system((bin + " " + args + server + " --token " + token + " > " + out + " 2> " + err).c_str());
  };
  ASSERT_EQ(run("apply-loan 12.5 --justification 'rebuttal runs'", "alice-token"), 0) << read_text(err);
  EXPECT_NE(run("approve-loan 1", "alice-token"), 0);
  EXPECT_NE(read_text(err).find("HTTP 403"), std::string::npos) << read_text(err);
  ASSERT_EQ(run("approve-loan 1 --note ok", "carol-token"), 0) << read_text(err);
  ASSERT_EQ(run("grant alice 3 --reason 'shared tool'", "carol-token"), 0) << read_text(err);
  ASSERT_EQ(run("balance", "alice-token"), 0) << read_text(err);
  EXPECT_NE(read_text(out).find("allowance 115.5 GPU-hours = monthly 100.0 + automatic loan 0.0 + loans 12.5 + "
                                "grants 3.0"),
            std::string::npos)
      << read_text(out);
  ASSERT_EQ(run("loans --state approved", "carol-token"), 0) << read_text(err);
  EXPECT_NE(read_text(out).find("rebuttal runs"), std::string::npos) << read_text(out);
}

}  // namespace
}  // namespace yolo8::quota
