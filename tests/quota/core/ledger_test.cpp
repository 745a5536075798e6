#include "quota/core/ledger.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "quota/core/engine.h"
#include "tests/quota/quota_test_util.h"

namespace yolo8::quota {
namespace {

using testing::kHour;
using testing::kMinute;
using testing::kMonday;
using Kind = AcquireResult::Kind;
using Refusal = LedgerError::Kind;

const int64_t kNov = kMonday + 9 * kHour;       // 2026-11-30 09:00 UTC
const int64_t kDec = kMonday + 24 * kHour + 1;  // just after the rollover to December

LeaseRequest req(const std::string& team, const std::string& user, int gpus = 1) {
  LeaseRequest r;
  r.team = team;
  r.user = user;
  r.job = "job";
  r.model = "yolov8s";
  r.gpus = gpus;
  return r;
}

// The example department with loans by application only (credits.automatic_loan: false).
Policy applications_policy() {
  Policy policy = testing::example_policy();
  policy.automatic_loan = false;
  return policy;
}

Refusal refusal_of(const std::function<void()>& call) {
  try {
    call();
  } catch (const LedgerError& error) {
    return error.kind();
  }
  ADD_FAILURE() << "no LedgerError";
  return Refusal::kInvalid;
}

bool has_audit(const Engine& e, const std::string& action, const std::string& actor) {
  return std::any_of(e.audit().begin(), e.audit().end(),
                     [&](const AuditEntry& a) { return a.action == action && a.actor == actor; });
}

void expect_sound(const Engine& e, int64_t now) {
  const auto errors = e.check_invariants(now);
  EXPECT_TRUE(errors.empty()) << errors.front();
}

TEST(Ledger, AutomaticLoanStaysTheDefault) {
  const Policy policy = testing::example_policy();
  EXPECT_TRUE(policy.automatic_loan);
  Engine e(policy);
  EXPECT_NEAR(e.credit_allowance("alice", "2026-11", kNov), 120.0, 1e-9);  // 100 + 20 without asking
  Engine off(applications_policy());
  EXPECT_NEAR(off.credit_allowance("alice", "2026-11", kNov), 100.0, 1e-9);
}

TEST(Ledger, LoanAppliedForApprovedByTheLeadAndRepaidNextMonth) {
  Engine e(applications_policy());
  e.restore({}, {}, {}, {{{"alice", "2026-11"}, 100.0}}, 1, 0);
  ASSERT_EQ(e.acquire(req("team-cv", "alice"), kNov).kind, Kind::kCreditsSpent);

  const Loan& loan = e.apply_loan("alice", 20, "deadline for the CVPR rebuttal", kNov);
  const int64_t id = loan.id;
  EXPECT_EQ(loan.state, LoanState::kPending);
  EXPECT_EQ(loan.team, "team-cv");
  EXPECT_TRUE(has_audit(e, "loan.requested", "alice"));
  // a pending loan raises nothing yet
  EXPECT_EQ(e.acquire(req("team-cv", "alice"), kNov).kind, Kind::kCreditsSpent);
  // never the applicant, never a plain member; the team's lead does
  EXPECT_EQ(refusal_of([&] { e.decide_loan(id, true, "alice", "", kNov); }), Refusal::kForbidden);
  EXPECT_EQ(refusal_of([&] { e.decide_loan(id, true, "bob", "", kNov); }), Refusal::kForbidden);
  EXPECT_EQ(refusal_of([&] { e.decide_loan(id, true, "dave", "", kNov); }), Refusal::kForbidden);  // other team
  e.decide_loan(id, true, "carol", "ok for the rebuttal", kNov + kMinute);
  EXPECT_EQ(e.find_loan(id)->state, LoanState::kApproved);
  EXPECT_EQ(e.find_loan(id)->decided_by, "carol");
  EXPECT_TRUE(has_audit(e, "loan.approved", "carol"));
  EXPECT_EQ(refusal_of([&] { e.decide_loan(id, false, "admin", "", kNov); }), Refusal::kConflict);
  EXPECT_NEAR(e.credit_allowance("alice", "2026-11", kNov), 120.0, 1e-9);

  // alice works 3 h on 4 GPUs on the loan: 12 GPU-hours of it are used
  const auto g = e.acquire(req("team-cv", "alice", 4), kNov + kMinute);
  ASSERT_EQ(g.kind, Kind::kGranted);
  for (int m = 2; m <= 181; ++m) {
    e.heartbeat(g.lease_id, {}, kNov + m * kMinute);
    e.tick(kNov + m * kMinute);
  }
  e.release(g.lease_id, Outcome::kCompleted, kNov + 181 * kMinute);
  EXPECT_NEAR(e.used_gpu_hours("alice", "2026-11", kNov + 181 * kMinute), 112.0, 1e-6);
  expect_sound(e, kNov + 181 * kMinute);

  // the rollover settles it: 12 of 20 were used and come out of December's credits
  e.take_changes();
  e.tick(kDec);
  const Loan* settled = e.find_loan(id);
  EXPECT_EQ(settled->state, LoanState::kRepaid);
  EXPECT_NEAR(settled->repaid_gpu_hours, 12.0, 1e-6);
  EXPECT_EQ(settled->repaid_in, "2026-12");
  EXPECT_TRUE(has_audit(e, "loan.repaid", "quotad"));
  EXPECT_EQ(e.take_changes().loans.count(id), 1u);  // persisted with the tick
  const MonthCredit december = e.month_credit_of("alice", "2026-12");
  EXPECT_NEAR(december.debt, 12.0, 1e-6);
  EXPECT_NEAR(december.allowance(), 88.0, 1e-6);
  EXPECT_NEAR(e.credit_allowance("alice", "2026-11", kNov), 120.0, 1e-9);  // the history stays as it was
  // settling again changes nothing
  e.tick(kDec + kMinute);
  EXPECT_TRUE(e.take_changes().loans.empty());
  expect_sound(e, kDec + kMinute);
}

TEST(Ledger, LoanLimitsPerMonthAndValidation) {
  Engine e(applications_policy());  // 2 applications, 50 GPU-hours per member and month
  const int64_t first = e.apply_loan("alice", 30, "a", kNov).id;
  EXPECT_EQ(refusal_of([&] { e.apply_loan("alice", 25, "b", kNov); }), Refusal::kLimit);  // 55 > 50
  e.decide_loan(first, false, "carol", "not now", kNov);
  EXPECT_TRUE(has_audit(e, "loan.rejected", "carol"));
  // a rejected application does not count
  e.apply_loan("alice", 25, "b", kNov);
  e.apply_loan("alice", 25, "c", kNov);
  EXPECT_EQ(refusal_of([&] { e.apply_loan("alice", 1, "d", kNov); }), Refusal::kLimit);  // third one
  for (const double bad :
       {0.0, -5.0, std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()}) {
    EXPECT_EQ(refusal_of([&] { e.apply_loan("bob", bad, "x", kNov); }), Refusal::kInvalid) << bad;
  }
  EXPECT_EQ(refusal_of([&] { e.apply_loan("bob", 5, "", kNov); }), Refusal::kInvalid);
  EXPECT_EQ(refusal_of([&] { e.apply_loan("bob", 5, "bell\x07", kNov); }), Refusal::kInvalid);
  EXPECT_EQ(refusal_of([&] { e.apply_loan("admin", 5, "x", kNov); }), Refusal::kForbidden);  // no team
  // a loan still pending when its month ends expires at the rollover
  const int64_t pending = e.apply_loan("bob", 5, "x", kNov).id;
  e.tick(kDec);
  EXPECT_EQ(e.find_loan(pending)->state, LoanState::kExpired);
  EXPECT_TRUE(has_audit(e, "loan.expired", "quotad"));
  expect_sound(e, kDec);
  Policy none = applications_policy();
  none.loan_applications_per_month = 0;
  Engine closed(none);
  EXPECT_EQ(refusal_of([&] { closed.apply_loan("alice", 5, "x", kNov); }), Refusal::kForbidden);
}

TEST(Ledger, ContributionCreditsAreGrantedByALeadCappedPerQuarterAndShownInTheBalance) {
  Engine e(applications_policy());  // at most 50 GPU-hours per member and quarter
  e.restore({}, {}, {}, {{{"alice", "2026-11"}, 100.0}}, 1, 0);
  ASSERT_EQ(e.acquire(req("team-cv", "alice"), kNov).kind, Kind::kCreditsSpent);
  EXPECT_EQ(refusal_of([&] { e.grant_credits("alice", 10, "my own tool", "alice", kNov); }), Refusal::kForbidden);
  EXPECT_EQ(refusal_of([&] { e.grant_credits("alice", 10, "a tool", "bob", kNov); }), Refusal::kForbidden);
  EXPECT_EQ(refusal_of([&] { e.grant_credits("alice", 10, "a tool", "dave", kNov); }), Refusal::kForbidden);
  EXPECT_EQ(refusal_of([&] { e.grant_credits("alice", 10, "", "carol", kNov); }), Refusal::kInvalid);
  const CreditGrant& grant = e.grant_credits("alice", 30, "shared augmentation library", "carol", kNov);
  EXPECT_EQ(grant.month, "2026-11");
  EXPECT_TRUE(has_audit(e, "credit.granted", "carol"));
  EXPECT_NEAR(e.month_credit_of("alice", "2026-11").grants, 30.0, 1e-9);
  EXPECT_NEAR(e.credit_allowance("alice", "2026-11", kNov), 130.0, 1e-9);
  EXPECT_EQ(e.acquire(req("team-cv", "alice"), kNov).kind, Kind::kGranted);
  e.grant_credits("alice", 20, "labelled dataset", "admin", kNov);  // 50 of 50 this quarter
  EXPECT_EQ(refusal_of([&] { e.grant_credits("alice", 0.5, "more", "admin", kNov); }), Refusal::kLimit);
  // December is still Q4; a grant is earned, not lent: November's use up to 150 is no debt
  EXPECT_EQ(refusal_of([&] { e.grant_credits("alice", 1, "more", "admin", kDec); }), Refusal::kLimit);
  EXPECT_NEAR(e.month_credit_of("alice", "2026-12").debt, 0.0, 1e-9);
  expect_sound(e, kDec);
  // tiny grants cannot pile up records without end: at most 100 per member and quarter
  for (int i = 0; i < 100; ++i) e.grant_credits("bob", 0.01, "typo fix", "carol", kNov);
  EXPECT_EQ(refusal_of([&] { e.grant_credits("bob", 0.01, "typo fix", "carol", kNov); }), Refusal::kLimit);
}

TEST(Ledger, RandomApplicationsDecisionsGrantsAndRolloversKeepTheInvariants) {
  Engine e(applications_policy());
  std::mt19937 random(19);
  const std::vector<std::string> people = {"alice", "bob", "carol", "dave", "erin", "oscar", "ivan", "admin"};
  auto pick = [&](const std::vector<std::string>& from) { return from[random() % from.size()]; };
  const double amounts[] = {-1, 0, 0.5, 5, 20, 49, 60, std::numeric_limits<double>::quiet_NaN()};
  int64_t now = kMonday - 60 * 24 * kHour;  // early October
  int applied = 0, approved = 0, granted = 0, refused = 0;
  for (int step = 0; step < 3000; ++step) {
    now += static_cast<int64_t>(random() % 90) * kMinute;
    try {
      switch (random() % 4) {
        case 0:
          e.apply_loan(pick(people), amounts[random() % 8], "why", now);
          ++applied;
          break;
        case 1: {
          if (e.loans().empty()) break;
          auto it = std::next(e.loans().begin(), static_cast<long>(random() % e.loans().size()));
          e.decide_loan(it->first, random() % 3 != 0, pick(people), "", now);
          ++approved;
          break;
        }
        case 2:
          e.grant_credits(pick(people), amounts[random() % 8], "tool", pick(people), now);
          ++granted;
          break;
        default: e.tick(now);
      }
    } catch (const LedgerError&) {
      ++refused;
    }
    const auto errors = e.check_invariants(now);
    ASSERT_TRUE(errors.empty()) << "step " << step << ": " << errors.front();
  }
  EXPECT_GT(applied, 20);
  EXPECT_GT(approved, 5);
  EXPECT_GT(granted, 5);
  EXPECT_GT(refused, 100);
  EXPECT_GE(month_key(now), "2026-12");  // several rollovers happened
  int settled = 0;
  for (const auto& [id, loan] : e.loans()) {
    if (loan.month < month_key(now)) {
      EXPECT_NE(loan.state, LoanState::kPending) << id;
      EXPECT_NE(loan.state, LoanState::kApproved) << id;
      ++settled;
    }
  }
  EXPECT_GT(settled, 0);
}

TEST(Ledger, PolicyKeysAreValidatedWithFileAndLine) {
  const std::string head = R"(inventory:
  nodes: [{name: n, gpus: 4, memory_gib: 80}]
users:
  a: {token_sha256: 9c220f200955d76c0a38d308225e0ef10c5f971acaf2f8d1d8f732affa5bd1dc}
teams:
  t: {base: 2, members: [a]}
credits:
  monthly_gpu_hours: 100
)";
  const Policy fine = load_policy_from_string(head +
                                                  "  automatic_loan: false\n  loan_applications_per_month: 1\n"
                                                  "  max_loan_gpu_hours_per_month: 30\n"
                                                  "  max_grant_gpu_hours_per_quarter: 0\n",
                                              "p.yaml");
  EXPECT_FALSE(fine.automatic_loan);
  EXPECT_EQ(fine.loan_applications_per_month, 1);
  EXPECT_DOUBLE_EQ(fine.max_loan_gpu_hours_per_month, 30);
  EXPECT_DOUBLE_EQ(fine.max_grant_gpu_hours_per_quarter, 0);
  const std::pair<std::string, std::string> bad[] = {
      {"  max_grant_gpu_hours_per_quarter: -1\n", "p.yaml:9: credits.max_grant_gpu_hours_per_quarter"},
      {"  max_loan_gpu_hours_per_month: .nan\n", "p.yaml:9: credits.max_loan_gpu_hours_per_month"},
      {"  loan_applications_per_month: -2\n", "p.yaml:9: credits.loan_applications_per_month"},
      {"  automatic_loan: maybe\n", "p.yaml:9"},
      {"  loans_per_month: 2\n", "p.yaml:9"},
  };
  for (const auto& [line, expected] : bad) {
    try {
      load_policy_from_string(head + line, "p.yaml");
      ADD_FAILURE() << line;
    } catch (const PolicyError& error) {
      EXPECT_NE(std::string(error.what()).find(expected), std::string::npos) << error.what();
    }
  }
}

TEST(Ledger, QuarterStringsAreValidatedNamingTheArgument) {
  EXPECT_EQ(quarter_months("2026-Q4"), (std::vector<std::string>{"2026-10", "2026-11", "2026-12"}));
  EXPECT_EQ(quarter_of("2026-11"), "2026-Q4");
  EXPECT_EQ(quarter_of("2027-01"), "2027-Q1");
  for (const std::string bad : {"2026-Q5", "2026-Q0", "2026Q4", "2026-q4", "26-Q4", "2026-Q4 ", ""}) {
    try {
      quarter_months(bad);
      ADD_FAILURE() << bad;
    } catch (const PolicyError& error) {
      EXPECT_NE(std::string(error.what()).find("--quarter"), std::string::npos) << error.what();
    }
  }
}

TEST(Ledger, RecordsRoundTripThroughJson) {
  Loan loan;
  loan.id = 7;
  loan.user = "alice";
  loan.team = "team-cv";
  loan.month = "2026-11";
  loan.gpu_hours = 12.5;
  loan.justification = "why";
  loan.state = LoanState::kRepaid;
  loan.repaid_gpu_hours = 3;
  loan.repaid_in = "2026-12";
  const Loan back = loan_from_json(to_json(loan));
  EXPECT_EQ(back.state, LoanState::kRepaid);
  EXPECT_DOUBLE_EQ(back.gpu_hours, 12.5);
  EXPECT_EQ(back.repaid_in, "2026-12");
  nlohmann::json bad = to_json(loan);
  bad["state"] = "forgiven";
  EXPECT_THROW(loan_from_json(bad), PolicyError);
}

}  // namespace
}  // namespace yolo8::quota
