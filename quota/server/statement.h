#pragma once
// `quotad report --quarter YYYY-Qn`: the quarter-end statement per member (balance, loans, contribution credits
// and a ranking), read from quotad's SQLite store.
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "quota/core/ledger.h"
#include "quota/core/policy.h"
#include "quota/store/state_store.h"

namespace yolo8::quota {

struct StatementMonth {
  std::string month;
  MonthCredit credit;  // the allowance's parts, as the engine computes them
  double used = 0;     // quotad's usage ledger
};

struct StatementMember {
  std::string user, team;
  std::vector<StatementMonth> months;  // the quarter's months that have begun
  double earned = 0;                   // monthly credits + grants of those months
  double carried_debt = 0;             // the overrun of the month before the quarter, repaid in its first month
  double used = 0;
  // The quarter's net position: credits earned minus GPU-hours used minus the debt carried in. Loans (automatic
  // or applied for) are advances, not credits: what was borrowed and used is already in `used`.
  double balance() const { return earned - carried_debt - used; }
  int loans_applied = 0, loans_approved = 0;
  double borrowed = 0, repaid = 0;  // approved loan GPU-hours, and the part of them used and paid back
  int grants = 0;
  double granted = 0;
  int rank = 0;  // 1 = the largest balance; equal balances and grants (as shown) share a rank
};

// Decimals of the GPU-hours the Markdown and HTML statement show; the ranking compares at this precision.
inline constexpr int kStatementDigits = 1;

// Sorts by balance, then GPU-hours granted, both rounded to kStatementDigits decimals as the statement prints them,
// and ranks them: members whose shown figures are equal share a rank (1, 2, 2, 2, 5), so nobody ranks below a
// member with the same printed balance.
void rank_members(std::vector<StatementMember>& members);

struct QuarterStatement {
  std::string quarter;
  std::vector<std::string> months;
  int64_t generated_ms = 0;
  int64_t quarter_end_ms = 0;
  bool in_progress() const { return generated_ms < quarter_end_ms; }
  std::vector<StatementMember> members;  // ranked
  std::vector<Loan> loans;               // applications for the quarter's months
  std::vector<CreditGrant> grants;       // grants in the quarter
};

// Approved (or repaid) loan and granted GPU-hours per (user, month) of the stored loans and grants. The monthly
// report's allowances use it.
struct LedgerTotals {
  std::map<std::pair<std::string, std::string>, double> loans, grants;
  double loan(const std::string& user, const std::string& month) const;
  double grant(const std::string& user, const std::string& month) const;
};
LedgerTotals ledger_totals(const std::vector<Loan>& loans, const std::vector<CreditGrant>& grants);

// Reads the database `db` names (a `--db`: a SQLite file or a PostgreSQL URL) read-only. `quarter` is "YYYY-Qn"
// (PolicyError naming --quarter otherwise); the policy gives the members and the credit rules. `now_ms` (0: the
// system clock) is the generation time; months that have not begun are left out.
QuarterStatement build_statement(const std::string& db, const std::string& quarter, const Policy& policy,
                                 int64_t now_ms = 0);
// The same through a reader already open (open_report_reader).
QuarterStatement build_statement(ReportReader& reader, const std::string& quarter, const Policy& policy,
                                 int64_t now_ms = 0);

std::string statement_markdown(const QuarterStatement& statement);
std::string statement_html(const QuarterStatement& statement);  // standalone, no scripts, numbers right-aligned
// One RFC 4180 table with a `record` column: statement, member, month, loan, grant.
std::string statement_csv(const QuarterStatement& statement);

}  // namespace yolo8::quota
