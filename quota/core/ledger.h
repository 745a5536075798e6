#pragma once
// The credit ledger beyond the monthly allowance: loan applications a lead approves, repaid from the
// next month's credits, and contribution credits an admin or lead grants. Records, their JSON forms, the
// allowance formula the engine, the quarter statement and the monthly report share, and quarter helpers.
// No I/O. The Engine methods that change these records are defined in ledger.cpp.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "quota/core/policy.h"

namespace yolo8::quota {

// pending -> approved -> repaid (at the first rollover after its month), or rejected, or expired (still pending
// when its month ended). Texts are the wire and storage form.
enum class LoanState { kPending, kApproved, kRejected, kRepaid, kExpired };
std::string to_string(LoanState state);
LoanState parse_loan_state(const std::string& text);  // PolicyError naming the field otherwise

struct Loan {
  int64_t id = 0;
  std::string user;
  std::string team;
  std::string month;  // "YYYY-MM": the month whose allowance it raises
  double gpu_hours = 0;
  std::string justification;
  LoanState state = LoanState::kPending;
  std::string decided_by;
  std::string note;
  int64_t created_ms = 0;
  int64_t decided_ms = 0;
  double repaid_gpu_hours = 0;  // the part of the month's overrun the next month paid back (<= gpu_hours)
  std::string repaid_in;        // the month that paid it back
  std::string idempotency_key;  // a retried application with the same key gets this loan back
};

struct CreditGrant {
  int64_t id = 0;
  std::string user;
  std::string team;
  std::string month;  // credited to this month's allowance
  double gpu_hours = 0;
  std::string reason;  // the contribution: a shared tool, a dataset, ...
  std::string granted_by;
  int64_t created_ms = 0;
};

// Why a loan or grant call was refused; the service maps the kind onto an HTTP status.
class LedgerError : public PolicyError {
 public:
  enum class Kind { kInvalid, kForbidden, kNotFound, kConflict, kLimit };
  LedgerError(Kind kind, const std::string& what) : PolicyError(what), kind_(kind) {}
  Kind kind() const { return kind_; }

 private:
  Kind kind_;
};

nlohmann::json to_json(const Loan& loan);
nlohmann::json to_json(const CreditGrant& grant);
// Storage round trip; a state text that is not one of LoanState's throws PolicyError naming the field.
Loan loan_from_json(const nlohmann::json& record);
CreditGrant grant_from_json(const nlohmann::json& record);

// The figures behind a member's allowance for one month.
struct MonthCredit {
  double monthly = 0;         // credits.monthly_gpu_hours
  double automatic_loan = 0;  // credits.loan_gpu_hours when credits.automatic_loan is on
  double loans = 0;           // approved (or repaid) loan applications for the month
  double grants = 0;          // contribution credits granted in the month
  double debt = 0;            // last month's use beyond its monthly credits and grants, paid back now
  double allowance() const { return monthly + automatic_loan + loans + grants - debt; }
};

// The one allowance formula: `prev_used` is the member's use in the previous month, `prev_grants` the grants of
// that month; last month's overrun beyond monthly + grants was a loan (automatic or applied for) and is repaid.
MonthCredit month_credit(const Policy& policy, double prev_used, double prev_grants, double loans, double grants);

// The three "YYYY-MM" months of "YYYY-Qn"; throws PolicyError naming `argument` ("--quarter: expected YYYY-Qn
// (Q1..Q4), got '...'").
std::vector<std::string> quarter_months(const std::string& quarter, const std::string& argument = "--quarter");

}  // namespace yolo8::quota
