#include "quota/core/ledger.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "quota/core/api.h"
#include "quota/core/codec.h"
#include "quota/core/engine.h"

namespace yolo8::quota {

namespace {

constexpr LoanState kLoanStates[] = {LoanState::kPending, LoanState::kApproved, LoanState::kRejected,
                                     LoanState::kRepaid, LoanState::kExpired};
constexpr size_t kMaxFreeText = 2000;
constexpr int kMaxGrantsPerQuarter = 100;  // per member
constexpr double kEps = 1e-9;

// A loan that raised its month's allowance (approved, and still so once repaid).
bool counts(LoanState state) { return state == LoanState::kApproved || state == LoanState::kRepaid; }

using Kind = LedgerError::Kind;

void check_amount(double gpu_hours) {
  if (!std::isfinite(gpu_hours) || !(gpu_hours > 0)) {
    throw LedgerError(Kind::kInvalid, "amount_gpu_hours: must be a finite number > 0");
  }
}

void check_free_text(const std::string& field, const std::string& text, const std::string& why) {
  if (text.empty()) throw LedgerError(Kind::kInvalid, field + ": required (" + why + ")");
  if (text.size() > kMaxFreeText) {
    throw LedgerError(Kind::kInvalid, field + ": longer than " + std::to_string(kMaxFreeText) + " characters");
  }
  try {
    check_text(field, text, true);
  } catch (const RequestError& error) {
    throw LedgerError(Kind::kInvalid, error.what());
  }
}

}  // namespace

std::string to_string(LoanState state) {
  switch (state) {
    case LoanState::kPending: return "pending";
    case LoanState::kApproved: return "approved";
    case LoanState::kRejected: return "rejected";
    case LoanState::kRepaid: return "repaid";
    case LoanState::kExpired: return "expired";
  }
  return "pending";
}

LoanState parse_loan_state(const std::string& text) {
  std::string accepted;
  for (const LoanState state : kLoanStates) {
    if (to_string(state) == text) return state;
    accepted += (accepted.empty() ? "" : ", ") + to_string(state);
  }
  throw PolicyError("state: '" + text + "' is not one of " + accepted);
}

nlohmann::json to_json(const Loan& loan) {
  return nlohmann::json{{"id", loan.id},
                        {"user", loan.user},
                        {"team", loan.team},
                        {"month", loan.month},
                        {"amount_gpu_hours", loan.gpu_hours},
                        {"justification", loan.justification},
                        {"state", to_string(loan.state)},
                        {"decided_by", loan.decided_by},
                        {"note", loan.note},
                        {"created_ms", loan.created_ms},
                        {"decided_ms", loan.decided_ms},
                        {"repaid_gpu_hours", loan.repaid_gpu_hours},
                        {"repaid_in", loan.repaid_in},
                        {"idempotency_key", loan.idempotency_key}};
}

nlohmann::json to_json(const CreditGrant& grant) {
  return nlohmann::json{{"id", grant.id},
                        {"user", grant.user},
                        {"team", grant.team},
                        {"month", grant.month},
                        {"quarter", quarter_of(grant.month)},
                        {"amount_gpu_hours", grant.gpu_hours},
                        {"reason", grant.reason},
                        {"granted_by", grant.granted_by},
                        {"created_ms", grant.created_ms}};
}

Loan loan_from_json(const nlohmann::json& record) {
  Loan loan;
  loan.id = record.at("id").get<int64_t>();
  loan.user = record.at("user").get<std::string>();
  loan.team = record.at("team").get<std::string>();
  loan.month = record.at("month").get<std::string>();
  loan.gpu_hours = record.at("amount_gpu_hours").get<double>();
  loan.justification = record.value("justification", "");
  loan.state = parse_loan_state(record.at("state").get<std::string>());
  loan.decided_by = record.value("decided_by", "");
  loan.note = record.value("note", "");
  loan.created_ms = record.value("created_ms", int64_t{0});
  loan.decided_ms = record.value("decided_ms", int64_t{0});
  loan.repaid_gpu_hours = record.value("repaid_gpu_hours", 0.0);
  loan.repaid_in = record.value("repaid_in", "");
  loan.idempotency_key = record.value("idempotency_key", "");
  return loan;
}

CreditGrant grant_from_json(const nlohmann::json& record) {
  CreditGrant grant;
  grant.id = record.at("id").get<int64_t>();
  grant.user = record.at("user").get<std::string>();
  grant.team = record.at("team").get<std::string>();
  grant.month = record.at("month").get<std::string>();
  grant.gpu_hours = record.at("amount_gpu_hours").get<double>();
  grant.reason = record.value("reason", "");
  grant.granted_by = record.value("granted_by", "");
  grant.created_ms = record.value("created_ms", int64_t{0});
  return grant;
}

MonthCredit month_credit(const Policy& policy, double prev_used, double prev_grants, double loans, double grants) {
  MonthCredit credit;
  credit.monthly = policy.monthly_gpu_hours;
  credit.automatic_loan = policy.automatic_loan ? policy.loan_gpu_hours : 0;
  credit.loans = loans;
  credit.grants = grants;
  // grants are earned, not lent: only use beyond monthly + grants is paid back
  credit.debt = std::max(0.0, prev_used - policy.monthly_gpu_hours - prev_grants);
  return credit;
}

std::vector<std::string> quarter_months(const std::string& quarter, const std::string& argument) {
  if (auto months = quarter_month_keys(quarter)) return *months;
  throw PolicyError(argument + ": expected YYYY-Qn (Q1..Q4), got '" + quarter + "'");
}

// ---- the Engine's ledger methods ----

void Engine::log_team(int64_t now_ms, const std::string& actor, const std::string& action, const std::string& team,
                      const std::string& detail) {
  AuditEntry entry;
  entry.seq = state_.next_audit_seq++;
  entry.ts_ms = now_ms;
  entry.actor = actor;
  entry.action = action;
  entry.team = team;
  entry.detail = detail;
  state_.audit.push_back(entry);
  state_.changes.audit.push_back(entry);
}

double Engine::granted_gpu_hours(const std::string& user, const std::string& month) const {
  double sum = 0;
  for (const auto& [id, grant] : state_.grants) {
    if (grant.user == user && grant.month == month) sum += grant.gpu_hours;
  }
  return sum;
}

MonthCredit Engine::month_credit_of(const std::string& user, const std::string& month) const {
  const std::string prev = previous_month_key(month);
  auto it = state_.usage.find({user, prev});
  double loans = 0;
  for (const auto& [id, loan] : state_.loans) {
    if (loan.user == user && loan.month == month && counts(loan.state)) loans += loan.gpu_hours;
  }
  return month_credit(policy_, it == state_.usage.end() ? 0 : it->second, granted_gpu_hours(user, prev), loans,
                      granted_gpu_hours(user, month));
}

const Loan* Engine::find_loan(int64_t loan_id) const {
  auto it = state_.loans.find(loan_id);
  return it == state_.loans.end() ? nullptr : &it->second;
}

const Loan& Engine::apply_loan(const std::string& user, double gpu_hours, const std::string& justification,
                               int64_t now_ms, const std::string& idempotency_key, bool* replayed) {
  if (replayed != nullptr) *replayed = false;
  if (!idempotency_key.empty()) {
    for (const auto& [id, loan] : state_.loans) {
      if (loan.user == user && loan.idempotency_key == idempotency_key) {
        if (replayed != nullptr) *replayed = true;
        return loan;
      }
    }
  }
  const auto user_it = policy_.users.find(user);
  if (user_it == policy_.users.end() || user_it->second.team.empty()) {
    throw LedgerError(Kind::kForbidden, "user: " + user + " is not a member of a team (loans are per member)");
  }
  if (policy_.monthly_gpu_hours <= 0) {
    throw LedgerError(Kind::kConflict, "credits: disabled in this policy (credits.monthly_gpu_hours: 0)");
  }
  if (policy_.loan_applications_per_month == 0) {
    throw LedgerError(Kind::kForbidden,
                      "credits.loan_applications_per_month is 0: this policy takes no loan "
                      "applications");
  }
  check_amount(gpu_hours);
  check_free_text("justification", justification, "why the member needs more GPU-hours");
  const std::string month = month_key(now_ms);
  int count = 0;
  double sum = 0;
  for (const auto& [id, loan] : state_.loans) {
    if (loan.user != user || loan.month != month) continue;
    if (loan.state == LoanState::kPending || counts(loan.state)) {
      ++count;
      sum += loan.gpu_hours;
    }
  }
  if (count >= policy_.loan_applications_per_month) {
    throw LedgerError(Kind::kLimit, "loans: " + user + " already has " + std::to_string(count) +
                                        " loan application(s) in " + month + " (credits.loan_applications_per_month: " +
                                        std::to_string(policy_.loan_applications_per_month) + ")");
  }
  if (sum + gpu_hours > policy_.max_loan_gpu_hours_per_month + kEps) {
    throw LedgerError(Kind::kLimit, "amount_gpu_hours: " + fixed_text(gpu_hours) + " more would make " +
                                        fixed_text(sum + gpu_hours) + " GPU-hours of loans for " + user + " in " +
                                        month + ", above credits.max_loan_gpu_hours_per_month (" +
                                        fixed_text(policy_.max_loan_gpu_hours_per_month) + ")");
  }
  Loan loan;
  loan.id = state_.next_loan++;
  loan.user = user;
  loan.team = user_it->second.team;
  loan.month = month;
  loan.gpu_hours = gpu_hours;
  loan.justification = justification;
  loan.idempotency_key = idempotency_key;
  loan.created_ms = now_ms;
  state_.changes.loans.insert(loan.id);
  log_team(now_ms, user, "loan.requested", loan.team,
           "loan " + std::to_string(loan.id) + ": " + fixed_text(gpu_hours) + " GPU-hours for " + month + ": " +
               justification);
  return state_.loans[loan.id] = loan;
}

const Loan& Engine::decide_loan(int64_t loan_id, bool approve, const std::string& by, const std::string& note,
                                int64_t now_ms) {
  auto it = state_.loans.find(loan_id);
  if (it == state_.loans.end()) throw LedgerError(Kind::kNotFound, "unknown loan " + std::to_string(loan_id));
  Loan& loan = it->second;
  const auto by_it = policy_.users.find(by);
  const bool admin = by_it != policy_.users.end() && by_it->second.role == Role::kAdmin;
  const bool lead =
      by_it != policy_.users.end() && by_it->second.role == Role::kLead && by_it->second.team == loan.team;
  if (!admin && !lead) {
    throw LedgerError(Kind::kForbidden, "role: only a lead of team " + loan.team + " (or an admin) decides loan " +
                                            std::to_string(loan_id));
  }
  if (by == loan.user) {
    throw LedgerError(Kind::kForbidden, "role: " + by + " cannot decide their own loan application (loan " +
                                            std::to_string(loan_id) + "); another lead of team " + loan.team +
                                            " or an admin does");
  }
  if (loan.state != LoanState::kPending) {
    throw LedgerError(Kind::kConflict, "loan " + std::to_string(loan_id) + " is already " + to_string(loan.state));
  }
  if (loan.month != month_key(now_ms)) {
    throw LedgerError(Kind::kConflict, "loan " + std::to_string(loan_id) + " was for " + loan.month +
                                           ", which has ended; apply again for this month");
  }
  if (!note.empty()) check_free_text("note", note, "");
  loan.state = approve ? LoanState::kApproved : LoanState::kRejected;
  loan.decided_by = by;
  loan.decided_ms = now_ms;
  loan.note = note;
  state_.changes.loans.insert(loan.id);
  log_team(now_ms, by, approve ? "loan.approved" : "loan.rejected", loan.team,
           "loan " + std::to_string(loan.id) + " of " + loan.user + ": " + fixed_text(loan.gpu_hours) +
               " GPU-hours for " + loan.month + (note.empty() ? "" : ": " + note));
  return loan;
}

const CreditGrant& Engine::grant_credits(const std::string& user, double gpu_hours, const std::string& reason,
                                         const std::string& by, int64_t now_ms) {
  const auto user_it = policy_.users.find(user);
  if (user_it == policy_.users.end() || user_it->second.team.empty()) {
    throw LedgerError(Kind::kInvalid, "user: unknown member '" + user + "' (not in a team of the policy)");
  }
  const std::string& team = user_it->second.team;
  const auto by_it = policy_.users.find(by);
  const bool admin = by_it != policy_.users.end() && by_it->second.role == Role::kAdmin;
  const bool lead = by_it != policy_.users.end() && by_it->second.role == Role::kLead && by_it->second.team == team;
  if (!admin && !lead) {
    throw LedgerError(Kind::kForbidden,
                      "role: only a lead of team " + team + " (or an admin) grants credits to " + user);
  }
  if (by == user) throw LedgerError(Kind::kForbidden, "role: " + by + " cannot grant credits to themselves");
  if (policy_.monthly_gpu_hours <= 0) {
    throw LedgerError(Kind::kConflict, "credits: disabled in this policy (credits.monthly_gpu_hours: 0)");
  }
  if (policy_.max_grant_gpu_hours_per_quarter <= 0) {
    throw LedgerError(Kind::kForbidden,
                      "credits.max_grant_gpu_hours_per_quarter is 0: this policy grants no "
                      "contribution credits");
  }
  check_amount(gpu_hours);
  check_free_text("reason", reason, "the contribution: a shared tool, a dataset, ...");
  const std::string month = month_key(now_ms);
  const std::string quarter = quarter_of(month);
  double sum = 0;
  int count = 0;
  for (const auto& [id, grant] : state_.grants) {
    if (grant.user == user && quarter_of(grant.month) == quarter) {
      sum += grant.gpu_hours;
      ++count;
    }
  }
  if (count >= kMaxGrantsPerQuarter) {
    // the GPU-hour cap alone would let tiny grants pile up records without end
    throw LedgerError(Kind::kLimit, "grants: " + user + " already has " + std::to_string(count) + " grants in " +
                                        quarter + " (at most " + std::to_string(kMaxGrantsPerQuarter) + ")");
  }
  if (sum + gpu_hours > policy_.max_grant_gpu_hours_per_quarter + kEps) {
    throw LedgerError(Kind::kLimit, "amount_gpu_hours: " + fixed_text(gpu_hours) + " more would make " +
                                        fixed_text(sum + gpu_hours) + " GPU-hours granted to " + user + " in " +
                                        quarter + ", above credits.max_grant_gpu_hours_per_quarter (" +
                                        fixed_text(policy_.max_grant_gpu_hours_per_quarter) + ")");
  }
  CreditGrant grant;
  grant.id = state_.next_grant++;
  grant.user = user;
  grant.team = team;
  grant.month = month;
  grant.gpu_hours = gpu_hours;
  grant.reason = reason;
  grant.granted_by = by;
  grant.created_ms = now_ms;
  state_.changes.grants.insert(grant.id);
  log_team(now_ms, by, "credit.granted", team,
           "grant " + std::to_string(grant.id) + ": " + fixed_text(gpu_hours) + " GPU-hours to " + user + " for " +
               month + ": " + reason);
  return state_.grants[grant.id] = grant;
}

void Engine::settle_loans(int64_t now_ms) {
  const std::string month = month_key(now_ms);
  // the overrun of a member's ended month, handed out over that month's loans in id order
  std::map<std::pair<std::string, std::string>, double> overrun_left;
  for (auto& [id, loan] : state_.loans) {
    if (loan.month >= month) continue;
    if (loan.state == LoanState::kPending) {
      loan.state = LoanState::kExpired;
      loan.decided_ms = now_ms;
      state_.changes.loans.insert(id);
      log_team(now_ms, "quotad", "loan.expired", loan.team,
               "loan " + std::to_string(id) + " of " + loan.user + " for " + loan.month +
                   " was not decided before the month ended");
    } else if (loan.state == LoanState::kApproved) {
      const auto key = std::make_pair(loan.user, loan.month);
      if (!overrun_left.count(key)) {
        auto used = state_.usage.find(key);
        overrun_left[key] = std::max(0.0, (used == state_.usage.end() ? 0 : used->second) - policy_.monthly_gpu_hours -
                                              granted_gpu_hours(loan.user, loan.month));
      }
      double& left = overrun_left[key];
      loan.repaid_gpu_hours = std::min(loan.gpu_hours, left);
      left -= loan.repaid_gpu_hours;
      loan.repaid_in = next_month_key(loan.month);
      loan.state = LoanState::kRepaid;
      state_.changes.loans.insert(id);
      log_team(now_ms, "quotad", "loan.repaid", loan.team,
               "loan " + std::to_string(id) + " of " + loan.user + ": " + fixed_text(loan.repaid_gpu_hours, 3) +
                   " of " + fixed_text(loan.gpu_hours) + " GPU-hours borrowed for " + loan.month +
                   " were used and are repaid from " + loan.repaid_in + "'s credits");
    }
  }
}

void Engine::check_ledger(std::vector<std::string>& errors) const {
  std::map<std::pair<std::string, std::string>, std::pair<int, double>> per_month;  // (user, month) -> count, sum
  std::map<std::pair<std::string, std::string>, double> per_quarter;
  for (const auto& [id, loan] : state_.loans) {
    const std::string name = "loan " + std::to_string(id);
    if (!(loan.gpu_hours > 0) || !std::isfinite(loan.gpu_hours)) errors.push_back(name + ": amount not > 0");
    if (loan.repaid_gpu_hours > loan.gpu_hours + kEps) errors.push_back(name + ": repaid more than borrowed");
    if (loan.decided_by == loan.user && !loan.decided_by.empty()) errors.push_back(name + ": decided by its applicant");
    if (loan.state == LoanState::kPending || counts(loan.state)) {
      auto& [count, sum] = per_month[{loan.user, loan.month}];
      ++count;
      sum += loan.gpu_hours;
    }
  }
  for (const auto& [key, figures] : per_month) {
    if (figures.first > policy_.loan_applications_per_month) {
      errors.push_back(key.first + " has " + std::to_string(figures.first) + " loans in " + key.second +
                       ", above credits.loan_applications_per_month");
    }
    if (figures.second > policy_.max_loan_gpu_hours_per_month + kEps) {
      errors.push_back(key.first + " borrowed " + fixed_text(figures.second) + " GPU-hours in " + key.second +
                       ", above credits.max_loan_gpu_hours_per_month");
    }
  }
  for (const auto& [id, grant] : state_.grants) {
    if (grant.granted_by == grant.user) errors.push_back("grant " + std::to_string(id) + ": granted to oneself");
    per_quarter[{grant.user, quarter_of(grant.month)}] += grant.gpu_hours;
  }
  for (const auto& [key, sum] : per_quarter) {
    if (sum > policy_.max_grant_gpu_hours_per_quarter + kEps) {
      errors.push_back(key.first + " was granted " + fixed_text(sum) + " GPU-hours in " + key.second +
                       ", above credits.max_grant_gpu_hours_per_quarter");
    }
  }
}

void Engine::restore_ledger(std::vector<Loan> loans, std::vector<CreditGrant> grants, int64_t next_loan_id,
                            int64_t next_grant_id) {
  state_.loans.clear();
  state_.grants.clear();
  state_.next_loan = std::max<int64_t>(1, next_loan_id);
  state_.next_grant = std::max<int64_t>(1, next_grant_id);
  for (auto& loan : loans) {
    state_.next_loan = std::max(state_.next_loan, loan.id + 1);
    state_.loans[loan.id] = std::move(loan);
  }
  for (auto& grant : grants) {
    state_.next_grant = std::max(state_.next_grant, grant.id + 1);
    state_.grants[grant.id] = std::move(grant);
  }
}

}  // namespace yolo8::quota
