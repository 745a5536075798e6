// `quotad report --quarter`: a scripted September to December with loans and grants in a real quotad database.
#include "quota/server/statement.h"

#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>

#include "quota/core/api.h"
#include "quota/server/report.h"
#include "quota/service/service.h"
#include "tests/quota/quota_test_util.h"

namespace yolo8::quota {
namespace {

using nlohmann::json;
using testing::kHour;
using testing::kMinute;

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string temp_path(const std::string& name) {
  const std::string dir = std::string(yolo8::test::kBinaryDir) + "/quota_test_tmp";
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/" + name + "_" + std::to_string(::getpid());
  for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(path + suffix);
  return path;
}

void replace(std::string& text, const std::string& from, const std::string& to) {
  const size_t at = text.find(from);
  ASSERT_NE(at, std::string::npos) << from;
  text.replace(at, from.size(), to);
}

// The example department with 10 GPU-hours a month, loans by application only.
std::string policy_file() {
  std::string yaml = read_text(testing::example_policy_path());
  replace(yaml, "credits: {monthly_gpu_hours: 100, loan_gpu_hours: 20}",
          "credits: {monthly_gpu_hours: 10, loan_gpu_hours: 0, automatic_loan: false}");
  replace(yaml, "memory_table: memory-table.yaml",
          "memory_table: " + std::string(yolo8::test::kSourceDir) + "/configs/memory-table.yaml");
  const std::string path = temp_path("statement_policy.yaml");
  std::ofstream(path) << yaml;
  return path;
}

int64_t at(const std::string& month, int day, int hour) {
  int64_t start = 0, end = 0;
  month_range_ms(month, start, end);
  return start + (day - 1) * 24 * kHour + hour * kHour;
}

struct History {
  std::string policy_path = policy_file();
  std::string db = temp_path("statement.db");
  std::shared_ptr<std::atomic<int64_t>> clock = std::make_shared<std::atomic<int64_t>>(0);
  std::unique_ptr<QuotaService> service;
  History() {
    ServiceOptions options;
    options.db_path = db;
    auto shared = clock;
    options.clock = [shared] { return shared->load(); };
    service = std::make_unique<QuotaService>(load_policy(policy_path), options);
  }
  json post(const std::string& path, const std::string& token, const std::string& body, int want) {
    const ApiResponse response = service->handle(testing::api_call("POST", path, token, body));
    EXPECT_EQ(response.status, want) << path << " " << response.body.dump();
    return response.body;
  }
  // A lease of `gpus` whole GPUs from `start` for `hours`, heartbeating every 30 s (within the policy's 60 s ttl,
  // so each gap is billed whole) up to its release (billed to the last heartbeat plus at most one interval).
  void run(const std::string& token, int gpus, int64_t start, double hours) {
    *clock = start;
    const json granted = post("/v1/leases", token, R"({"model":"yolov8s","gpus":)" + std::to_string(gpus) + "}", 201);
    const std::string path = "/v1/leases/" + std::to_string(granted.value("lease_id", 0));
    const int64_t end = start + static_cast<int64_t>(hours * static_cast<double>(kHour));
    for (int64_t t = start + kMinute / 2; t <= end; t += kMinute / 2) {
      *clock = t;
      post(path + "/heartbeat", token, "{}", 200);
    }
    *clock = end;
    post(path + "/release", token, "{}", 200);
  }
};

// September: erin uses 14 of 10 (4 carried into Q4). November: alice borrows 10 (approved by carol) and uses 16,
// carol grants bob 5 for a dataset, bob uses 2. December: the rollover repays 6 of alice's loan; she uses 1.
const std::string& scripted_db() {
  static const std::string db = [] {
    History h;
    h.run("erin-token", 2, at("2026-09", 10, 9), 7);
    *h.clock = at("2026-11", 3, 9);
    const json loan =
        h.post("/v1/loans", "alice-token", R"({"amount_gpu_hours": 10, "justification": "ablation"})", 201);
    h.post("/v1/loans/" + std::to_string(loan.value("id", 0)) + "/approve", "carol-token", "{}", 200);
    h.post("/v1/credits", "carol-token",
           R"({"user": "bob", "amount_gpu_hours": 5, "reason": "labelled pallet dataset, shared"})", 201);
    h.run("alice-token", 4, at("2026-11", 4, 9), 4);
    h.run("bob-token", 1, at("2026-11", 5, 9), 2);
    *h.clock = at("2026-12", 1, 0) + 1000;
    h.service->tick();  // the rollover settles the loan
    h.run("alice-token", 1, at("2026-12", 10, 9), 1);
    return h.db;
  }();
  return db;
}

const StatementMember& member(const QuarterStatement& statement, const std::string& user) {
  for (const auto& row : statement.members) {
    if (row.user == user) return row;
  }
  throw std::runtime_error("no member " + user);
}

TEST(QuotadStatement, BalancesLoansGrantsAndRanking) {
  const Policy policy = load_policy(policy_file());
  const QuarterStatement statement = build_statement(scripted_db(), "2026-Q4", policy, at("2026-12", 15, 12));
  EXPECT_TRUE(statement.in_progress());
  EXPECT_EQ(statement.months, (std::vector<std::string>{"2026-10", "2026-11", "2026-12"}));
  const StatementMember& alice = member(statement, "alice");
  EXPECT_DOUBLE_EQ(alice.earned, 30);
  EXPECT_DOUBLE_EQ(alice.used, 17);
  EXPECT_DOUBLE_EQ(alice.balance(), 13);
  EXPECT_EQ(alice.loans_applied, 1);
  EXPECT_EQ(alice.loans_approved, 1);
  EXPECT_DOUBLE_EQ(alice.borrowed, 10);
  EXPECT_DOUBLE_EQ(alice.repaid, 6);
  ASSERT_EQ(alice.months.size(), 3u);
  EXPECT_DOUBLE_EQ(alice.months[1].credit.allowance(), 20);  // 10 + the loan
  EXPECT_DOUBLE_EQ(alice.months[2].credit.debt, 6);
  EXPECT_DOUBLE_EQ(alice.months[2].credit.allowance(), 4);
  const StatementMember& bob = member(statement, "bob");
  EXPECT_DOUBLE_EQ(bob.granted, 5);
  EXPECT_DOUBLE_EQ(bob.balance(), 33);
  EXPECT_EQ(bob.rank, 1);
  const StatementMember& erin = member(statement, "erin");
  EXPECT_DOUBLE_EQ(erin.carried_debt, 4);
  EXPECT_DOUBLE_EQ(erin.balance(), 26);
  EXPECT_EQ(member(statement, "carol").rank, 2);
  EXPECT_EQ(member(statement, "ivan").rank, 2);  // equal balances share a rank
  EXPECT_EQ(erin.rank, 6);
  EXPECT_EQ(alice.rank, 7);
  EXPECT_EQ(statement.members.back().user, "alice");
  ASSERT_EQ(statement.loans.size(), 1u);
  EXPECT_EQ(statement.loans[0].state, LoanState::kRepaid);
  ASSERT_EQ(statement.grants.size(), 1u);

  // before December began, the statement covers October and November only
  const QuarterStatement november = build_statement(scripted_db(), "2026-Q4", policy, at("2026-11", 20, 0));
  EXPECT_EQ(november.months.size(), 2u);
  // another quarter: nothing lent, nothing granted, Q3's overrun shown for erin
  const QuarterStatement q3 = build_statement(scripted_db(), "2026-Q3", policy, at("2026-12", 15, 12));
  EXPECT_FALSE(q3.in_progress());
  EXPECT_DOUBLE_EQ(member(q3, "erin").used, 14);
  EXPECT_TRUE(q3.loans.empty());
  EXPECT_THROW(build_statement(scripted_db(), "2026-Q5", policy), PolicyError);
}

StatementMember with_balance(const std::string& user, double balance, double granted = 0) {
  StatementMember member;
  member.user = user;
  member.earned = balance;
  member.granted = granted;
  return member;
}

// Ranked as printed: 12.04, 12.03 and 12.02 all print 12.0, so they share the 2nd place and the next
// member is 5th; before, the ranking compared three decimals and printed one (2nd, 2nd, 4th on the same "12.0").
TEST(QuotadStatement, MembersWithTheSamePrintedBalanceShareARank) {
  std::vector<StatementMember> members = {with_balance("erin", 11.9), with_balance("carol", 12.03),
                                          with_balance("alice", 20), with_balance("bob", 12.04),
                                          with_balance("dave", 12.02)};
  rank_members(members);
  std::vector<std::pair<std::string, int>> ranks;
  for (const auto& m : members) ranks.emplace_back(m.user, m.rank);
  EXPECT_EQ(ranks, (std::vector<std::pair<std::string, int>>{
                       {"alice", 1}, {"carol", 2}, {"bob", 2}, {"dave", 2}, {"erin", 5}}));

  // any members: equal printed balance and grants <=> equal rank, and the rank is 1 + those shown ahead
  std::mt19937 random(7);
  std::uniform_int_distribution<int> centi(-500, 500);
  for (int round = 0; round < 200; ++round) {
    std::vector<StatementMember> many;
    for (int i = 0; i < 12; ++i)
      many.push_back(with_balance("m" + std::to_string(i), centi(random) / 37.0, (i % 3) * 0.04));
    rank_members(many);
    for (const auto& a : many) {
      int ahead = 0;
      for (const auto& b : many) {
        const std::string ab = fixed_text(a.balance(), kStatementDigits),
                          bb = fixed_text(b.balance(), kStatementDigits);
        const std::string ag = fixed_text(a.granted, kStatementDigits), bg = fixed_text(b.granted, kStatementDigits);
        if (ab == bb && ag == bg) EXPECT_EQ(a.rank, b.rank) << a.user << " " << b.user << " " << ab;
        if (std::make_pair(std::stod(bb), std::stod(bg)) > std::make_pair(std::stod(ab), std::stod(ag))) ++ahead;
      }
      EXPECT_EQ(a.rank, ahead + 1) << a.user;
    }
  }
}

TEST(QuotadStatement, MonthlyReportUsesTheSameAllowance) {
  const Policy policy = load_policy(policy_file());
  auto allowance = [&](const std::string& month, const std::string& user) {
    for (const auto& credit : build_report(scripted_db(), month, &policy, 10, at("2026-12", 15, 12)).credits) {
      if (credit.user == user) return credit.allowance;
    }
    return -2.0;
  };
  EXPECT_DOUBLE_EQ(allowance("2026-11", "alice"), 20);  // 10 + the approved loan
  EXPECT_DOUBLE_EQ(allowance("2026-12", "alice"), 4);   // 10 - the 6 repaid
  EXPECT_DOUBLE_EQ(allowance("2026-11", "bob"), 15);    // 10 + the grant
  EXPECT_DOUBLE_EQ(allowance("2026-10", "erin"), 6);    // 10 - September's overrun
}

TEST(QuotadStatement, MarkdownHtmlAndCsv) {
  const Policy policy = load_policy(policy_file());
  const QuarterStatement statement = build_statement(scripted_db(), "2026-Q4", policy, at("2026-12", 15, 12));
  const std::string md = statement_markdown(statement);
  EXPECT_NE(md.find("# Quarter statement 2026-Q4"), std::string::npos);
  EXPECT_NE(md.find("| 1 | bob | team-cv | 35.0 | 0.0 | 2.0 | 33.0 | 0 / 0 | 0.0 | 0.0 | 1 | 5.0 |"), std::string::npos)
      << md;
  EXPECT_NE(md.find("| alice | 2026-12 | 10.0 | 0.0 | 0.0 | 0.0 | 6.0 | 4.0 | 1.0 | 3.0 |"), std::string::npos) << md;
  EXPECT_NE(md.find("---:|"), std::string::npos);
  EXPECT_NE(md.find("labelled pallet dataset, shared"), std::string::npos);
  const std::string html = statement_html(statement);
  EXPECT_NE(html.find("<td class=\"n\">33.0</td>"), std::string::npos);
  EXPECT_EQ(html.find("<script"), std::string::npos);
  const std::string csv = statement_csv(statement);
  EXPECT_NE(csv.find("member,2026-Q4,1,bob,team-cv,"), std::string::npos) << csv;
  EXPECT_NE(csv.find("\"labelled pallet dataset, shared\""), std::string::npos);
  // every row has the header's number of fields (no field here holds a quoted comma but the grant's reason)
  std::istringstream lines(csv);
  std::string header;
  std::getline(lines, header);
  const auto commas = std::count(header.begin(), header.end(), ',');
  for (std::string line; std::getline(lines, line);) {
    if (line.find("\"labelled") != std::string::npos) continue;
    EXPECT_EQ(std::count(line.begin(), line.end(), ','), commas) << line;
  }
}

TEST(QuotadStatement, CommandLineValidatesTheQuarter) {
  const std::string bin = std::string(yolo8::test::kBinaryDir) + "/quota/quotad";
  const std::string out = temp_path("statement.csv");
  const std::string cmd = bin + " report --quarter 2026-Q4 --format csv --db " + scripted_db() + " --policy " +
                          policy_file() + " --out " + out;
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  EXPECT_NE(read_text(out).find("member,2026-Q4,1,bob"), std::string::npos);
  const std::string err = temp_path("statement.err");
  const std::string bad =
      bin + " report --quarter 2026-Q5 --db " + scripted_db() + " --policy " + policy_file() + " > /dev/null 2> " + err;
  EXPECT_NE(std::system(bad.c_str()), 0);
  EXPECT_NE(read_text(err).find("--quarter: expected YYYY-Qn"), std::string::npos) << read_text(err);
  const std::string both = bin + " report --quarter 2026-Q4 --month 2026-11 --db " + scripted_db() + " --policy " +
                           policy_file() + " > /dev/null 2> " + err;
  EXPECT_NE(std::system(both.c_str()), 0);
  const std::string no_policy = bin + " report --quarter 2026-Q4 --db " + scripted_db() + " > /dev/null 2> " + err;
  EXPECT_NE(std::system(no_policy.c_str()), 0);
  EXPECT_NE(read_text(err).find("--policy"), std::string::npos) << read_text(err);
}

// Only approved loans (and those repaid since, which raised their month all the same) count; grants all do.
TEST(QuotadStatement, LedgerTotalsCountApprovedAndRepaidLoansAndEveryGrant) {
  auto loan = [](const char* user, const char* month, double hours, LoanState state) {
    Loan record;
    record.user = user;
    record.month = month;
    record.gpu_hours = hours;
    record.state = state;
    return record;
  };
  CreditGrant grant;
  grant.user = "alice";
  grant.month = "2026-11";
  grant.gpu_hours = 3;
  const LedgerTotals totals = ledger_totals(
      {loan("alice", "2026-11", 10, LoanState::kApproved), loan("alice", "2026-11", 5, LoanState::kRepaid),
       loan("alice", "2026-11", 7, LoanState::kPending), loan("alice", "2026-11", 9, LoanState::kRejected),
       loan("alice", "2026-12", 4, LoanState::kApproved), loan("bob", "2026-11", 2, LoanState::kExpired)},
      {grant, grant});
  EXPECT_DOUBLE_EQ(totals.loan("alice", "2026-11"), 15);
  EXPECT_DOUBLE_EQ(totals.loan("alice", "2026-12"), 4);
  EXPECT_DOUBLE_EQ(totals.loan("bob", "2026-11"), 0);
  EXPECT_DOUBLE_EQ(totals.grant("alice", "2026-11"), 6);
  EXPECT_DOUBLE_EQ(totals.grant("bob", "2026-11"), 0);
}

}  // namespace
}  // namespace yolo8::quota
