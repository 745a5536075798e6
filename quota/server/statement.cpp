#include "quota/server/statement.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <stdexcept>

#include "quota/core/api.h"
#include "quota/core/calendar.h"
#include "quota/server/report.h"
#include "quota/server/status_page.h"
#include "quota/store/store.h"

namespace yolo8::quota {

void rank_members(std::vector<StatementMember>& members) {
  // the figures as printed, read back: equal text is an equal key, whatever the rounding rule of the printing
  auto shown = [](double value) { return std::stod(fixed_text(value, kStatementDigits)); };
  auto key = [&](const StatementMember& member) {
    return std::make_pair(shown(member.balance()), shown(member.granted));
  };
  std::stable_sort(members.begin(), members.end(),
                   [&](const StatementMember& left, const StatementMember& right) { return key(left) > key(right); });
  for (size_t i = 0; i < members.size(); ++i) {
    members[i].rank = i > 0 && key(members[i]) == key(members[i - 1]) ? members[i - 1].rank : static_cast<int>(i) + 1;
  }
}

QuarterStatement build_statement(const std::string& db, const std::string& quarter, const Policy& policy,
                                 int64_t now_ms) {
  quarter_months(quarter);  // validates before anything is opened
  const std::unique_ptr<ReportReader> reader = open_report_reader(parse_db_target(db));
  return build_statement(*reader, quarter, policy, now_ms);
}

QuarterStatement build_statement(ReportReader& reader, const std::string& quarter, const Policy& policy,
                                 int64_t now_ms) {
  QuarterStatement statement;
  statement.quarter = quarter;
  const std::vector<std::string> months = quarter_months(quarter);  // validates first
  statement.generated_ms =
      now_ms > 0
          ? now_ms
          : std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
                .count();
  int64_t start = 0, end = 0;
  month_range_ms(months.back(), start, end);
  statement.quarter_end_ms = end;
  for (const auto& month : months) {
    month_range_ms(month, start, end);
    if (start <= statement.generated_ms) statement.months.push_back(month);
  }
  const std::string before = previous_month_key(months.front());

  std::set<std::string> wanted(statement.months.begin(), statement.months.end());
  wanted.insert(before);
  const std::map<std::pair<std::string, std::string>, double> usage =
      reader.usage(std::vector<std::string>(wanted.begin(), wanted.end()));
  std::vector<Loan> loans;
  for (Loan& loan : reader.loans()) {
    if (wanted.count(loan.month)) loans.push_back(std::move(loan));
  }
  std::vector<CreditGrant> grants;
  for (CreditGrant& grant : reader.grants()) {
    if (wanted.count(grant.month)) grants.push_back(std::move(grant));
  }

  std::map<std::string, std::string> members;  // user -> team
  for (const auto& [name, team] : policy.teams) {
    for (const auto& user : team.members) members[user] = name;
    for (const auto& user : team.leads) members[user] = name;
  }
  auto granted = [&](const std::string& user, const std::string& month) {
    double sum = 0;
    for (const auto& grant : grants) sum += grant.user == user && grant.month == month ? grant.gpu_hours : 0;
    return sum;
  };
  auto used = [&](const std::string& user, const std::string& month) {
    auto it = usage.find({user, month});
    return it == usage.end() ? 0.0 : it->second;
  };
  for (const auto& [user, team] : members) {
    StatementMember member;
    member.user = user;
    member.team = team;
    for (const auto& month : statement.months) {
      double borrowed = 0;
      for (const auto& loan : loans) {
        if (loan.user != user || loan.month != month) continue;
        ++member.loans_applied;
        if (loan.state == LoanState::kApproved || loan.state == LoanState::kRepaid) {
          ++member.loans_approved;
          borrowed += loan.gpu_hours;
          member.repaid += loan.repaid_gpu_hours;
        }
      }
      const std::string prev = previous_month_key(month);
      StatementMonth row;
      row.month = month;
      row.credit = month_credit(policy, used(user, prev), granted(user, prev), borrowed, granted(user, month));
      row.used = used(user, month);
      member.borrowed += borrowed;
      member.earned += row.credit.monthly + row.credit.grants;
      member.used += row.used;
      member.months.push_back(row);
    }
    if (!member.months.empty()) member.carried_debt = member.months.front().credit.debt;
    for (const auto& grant : grants) {
      if (grant.user == user && std::count(statement.months.begin(), statement.months.end(), grant.month)) {
        ++member.grants;
        member.granted += grant.gpu_hours;
      }
    }
    statement.members.push_back(member);
  }
  rank_members(statement.members);
  for (const auto& loan : loans) {
    if (loan.month != before) statement.loans.push_back(loan);
  }
  for (const auto& grant : grants) {
    if (grant.month != before) statement.grants.push_back(grant);
  }
  return statement;
}

double LedgerTotals::loan(const std::string& user, const std::string& month) const {
  auto it = loans.find({user, month});
  return it == loans.end() ? 0 : it->second;
}

double LedgerTotals::grant(const std::string& user, const std::string& month) const {
  auto it = grants.find({user, month});
  return it == grants.end() ? 0 : it->second;
}

LedgerTotals ledger_totals(const std::vector<Loan>& loans, const std::vector<CreditGrant>& grants) {
  LedgerTotals totals;
  for (const Loan& loan : loans) {
    if (loan.state == LoanState::kApproved || loan.state == LoanState::kRepaid) {
      totals.loans[{loan.user, loan.month}] += loan.gpu_hours;
    }
  }
  for (const CreditGrant& grant : grants) totals.grants[{grant.user, grant.month}] += grant.gpu_hours;
  return totals;
}

namespace {

// One table of the statement, rendered the same way in Markdown and HTML.
struct Table {
  std::string title;
  std::vector<std::pair<std::string, bool>> columns;  // name, right-aligned number
  std::vector<std::vector<std::string>> rows;
  std::string empty_text;
};

std::string note(const QuarterStatement& statement) {
  std::string text = "Generated at " + utc_minutes(statement.generated_ms) + " UTC.";
  if (statement.in_progress()) {
    text += " The quarter is still running (it ends " + utc_minutes(statement.quarter_end_ms) +
            " UTC): the figures run up to the generation time" +
            (statement.months.size() < 3 ? ", and months that have not begun are left out." : ".");
  }
  return text +
         " Balance = credits earned (monthly credits + contribution grants) - GPU-hours used - the overrun "
         "carried in from the month before the quarter; loans are advances, so what was borrowed and used "
         "is already in the use. Ranked by balance, then grants.";
}

std::vector<Table> tables(const QuarterStatement& statement) {
  std::vector<Table> out;
  Table ranking{"Ranking",
                {{"rank", true},
                 {"member", false},
                 {"team", false},
                 {"earned", true},
                 {"carried debt", true},
                 {"used", true},
                 {"balance", true},
                 {"loans (approved / applied)", true},
                 {"borrowed", true},
                 {"repaid", true},
                 {"grants", true},
                 {"granted", true}},
                {},
                "No members in the policy."};
  Table months{"Months",
               {{"member", false},
                {"month", false},
                {"monthly", true},
                {"automatic loan", true},
                {"loans", true},
                {"grants", true},
                {"repaying", true},
                {"allowance", true},
                {"used", true},
                {"left", true}},
               {},
               "No month of the quarter has begun."};
  for (const auto& member : statement.members) {
    constexpr int kDigits = kStatementDigits;
    ranking.rows.push_back({std::to_string(member.rank), member.user, member.team, fixed_text(member.earned, kDigits),
                            fixed_text(member.carried_debt, kDigits), fixed_text(member.used, kDigits),
                            fixed_text(member.balance(), kDigits),
                            std::to_string(member.loans_approved) + " / " + std::to_string(member.loans_applied),
                            fixed_text(member.borrowed, 1), fixed_text(member.repaid, 1), std::to_string(member.grants),
                            fixed_text(member.granted, kDigits)});
    for (const auto& month : member.months) {
      months.rows.push_back({member.user, month.month, fixed_text(month.credit.monthly, 1),
                             fixed_text(month.credit.automatic_loan, 1), fixed_text(month.credit.loans, 1),
                             fixed_text(month.credit.grants, 1), fixed_text(month.credit.debt, 1),
                             fixed_text(month.credit.allowance(), 1), fixed_text(month.used, 1),
                             fixed_text(month.credit.allowance() - month.used, 1)});
    }
  }
  Table loans{"Loans",
              {{"loan", true},
               {"member", false},
               {"team", false},
               {"month", false},
               {"GPU-hours", true},
               {"state", false},
               {"decided by", false},
               {"repaid", true},
               {"justification", false}},
              {},
              "No loan applications."};
  for (const auto& loan : statement.loans) {
    loans.rows.push_back({std::to_string(loan.id), loan.user, loan.team, loan.month, fixed_text(loan.gpu_hours, 1),
                          to_string(loan.state), loan.decided_by.empty() ? "-" : loan.decided_by,
                          fixed_text(loan.repaid_gpu_hours, 1), loan.justification});
  }
  Table grants{"Contribution credits",
               {{"grant", true},
                {"member", false},
                {"team", false},
                {"month", false},
                {"GPU-hours", true},
                {"granted by", false},
                {"reason", false}},
               {},
               "No contribution credits granted."};
  for (const auto& grant : statement.grants) {
    grants.rows.push_back({std::to_string(grant.id), grant.user, grant.team, grant.month,
                           fixed_text(grant.gpu_hours, 1), grant.granted_by, grant.reason});
  }
  out.push_back(ranking);
  out.push_back(months);
  out.push_back(loans);
  out.push_back(grants);
  return out;
}

std::string markdown_cell(const std::string& text) {
  std::string out;
  for (char ch : text) {
    if (ch == '|') {
      out += "\\|";
    } else if (ch == '\n' || ch == '\r' || ch == '\t') {
      out += ' ';
    } else {
      out += ch;
    }
  }
  return out;
}

std::string csv_field(const std::string& text) {
  if (text.find_first_of(",\"\r\n") == std::string::npos) return text;
  std::string out = "\"";
  for (char ch : text) {
    if (ch == '"') out += '"';
    out += ch;
  }
  return out + "\"";
}

}  // namespace

std::string statement_markdown(const QuarterStatement& statement) {
  std::ostringstream out;
  out << "# Quarter statement " << statement.quarter << "\n\n" << note(statement) << "\n";
  for (const Table& table : tables(statement)) {
    out << "\n## " << table.title << "\n\n";
    if (table.rows.empty()) {
      out << table.empty_text << "\n";
      continue;
    }
    std::string rule = "|";
    out << "|";
    for (const auto& [name, number] : table.columns) {
      out << " " << name << " |";
      rule += number ? "---:|" : "---|";
    }
    out << "\n" << rule << "\n";
    for (const auto& row : table.rows) {
      out << "|";
      for (const auto& cell : row) out << " " << markdown_cell(cell) << " |";
      out << "\n";
    }
  }
  return out.str();
}

std::string statement_html(const QuarterStatement& statement) {
  std::ostringstream out;
  out << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>Quarter statement "
      << html_escape(statement.quarter)
      << "</title>\n<style>body{font-family:system-ui,sans-serif;margin:24px;color:#1d2330}"
         "table{border-collapse:collapse;margin:8px 0 16px}th,td{border:1px solid #dde1e7;padding:4px 10px;"
         "text-align:left;font-size:13px}th{background:#eef1f5}"
         "th.n,td.n{text-align:right;font-variant-numeric:tabular-nums}</style></head><body>\n"
      << "<h1>Quarter statement " << html_escape(statement.quarter) << "</h1>\n<p>" << html_escape(note(statement))
      << "</p>\n";
  for (const Table& table : tables(statement)) {
    out << "<h2>" << html_escape(table.title) << "</h2>\n";
    if (table.rows.empty()) {
      out << "<p>" << html_escape(table.empty_text) << "</p>\n";
      continue;
    }
    out << "<table><thead><tr>";
    for (const auto& [name, number] : table.columns) {
      out << (number ? "<th class=\"n\">" : "<th>") << html_escape(name) << "</th>";
    }
    out << "</tr></thead><tbody>\n";
    for (const auto& row : table.rows) {
      out << "<tr>";
      for (size_t i = 0; i < row.size(); ++i) {
        out << (table.columns[i].second ? "<td class=\"n\">" : "<td>") << html_escape(row[i]) << "</td>";
      }
      out << "</tr>\n";
    }
    out << "</tbody></table>\n";
  }
  out << "</body></html>\n";
  return out.str();
}

std::string statement_csv(const QuarterStatement& statement) {
  const std::vector<std::string> columns = {"record",
                                            "quarter",
                                            "rank",
                                            "user",
                                            "team",
                                            "month",
                                            "earned_gpu_hours",
                                            "carried_debt_gpu_hours",
                                            "monthly_gpu_hours",
                                            "automatic_loan_gpu_hours",
                                            "loans_gpu_hours",
                                            "grants_gpu_hours",
                                            "repaying_gpu_hours",
                                            "allowance_gpu_hours",
                                            "used_gpu_hours",
                                            "balance_gpu_hours",
                                            "id",
                                            "amount_gpu_hours",
                                            "state",
                                            "by",
                                            "repaid_gpu_hours",
                                            "time_utc",
                                            "text"};
  std::ostringstream out;
  auto row = [&](const std::map<std::string, std::string>& fields) {
    for (const auto& [name, value] : fields) {
      if (std::find(columns.begin(), columns.end(), name) == columns.end()) {
        throw std::logic_error("statement_csv: no column " + name);
      }
    }
    for (size_t i = 0; i < columns.size(); ++i) {
      auto it = fields.find(columns[i]);
      out << (i ? "," : "") << (it == fields.end() ? "" : csv_field(it->second));
    }
    out << "\r\n";
  };
  for (size_t i = 0; i < columns.size(); ++i) out << (i ? "," : "") << columns[i];
  out << "\r\n";
  row({{"record", "statement"},
       {"quarter", statement.quarter},
       {"time_utc", utc_minutes(statement.generated_ms)},
       {"text", statement.in_progress() ? "quarter in progress: figures up to time_utc" : "quarter complete"}});
  for (const auto& member : statement.members) {
    row({{"record", "member"},
         {"quarter", statement.quarter},
         {"rank", std::to_string(member.rank)},
         {"user", member.user},
         {"team", member.team},
         {"earned_gpu_hours", fixed_text(member.earned, 3)},
         {"carried_debt_gpu_hours", fixed_text(member.carried_debt, 3)},
         {"loans_gpu_hours", fixed_text(member.borrowed, 3)},
         {"grants_gpu_hours", fixed_text(member.granted, 3)},
         {"used_gpu_hours", fixed_text(member.used, 3)},
         {"balance_gpu_hours", fixed_text(member.balance(), 3)},
         {"repaid_gpu_hours", fixed_text(member.repaid, 3)}});
    for (const auto& month : member.months) {
      row({{"record", "month"},
           {"quarter", statement.quarter},
           {"user", member.user},
           {"team", member.team},
           {"month", month.month},
           {"monthly_gpu_hours", fixed_text(month.credit.monthly, 3)},
           {"automatic_loan_gpu_hours", fixed_text(month.credit.automatic_loan, 3)},
           {"loans_gpu_hours", fixed_text(month.credit.loans, 3)},
           {"grants_gpu_hours", fixed_text(month.credit.grants, 3)},
           {"repaying_gpu_hours", fixed_text(month.credit.debt, 3)},
           {"allowance_gpu_hours", fixed_text(month.credit.allowance(), 3)},
           {"used_gpu_hours", fixed_text(month.used, 3)},
           {"balance_gpu_hours", fixed_text(month.credit.allowance() - month.used, 3)}});
    }
  }
  for (const auto& loan : statement.loans) {
    row({{"record", "loan"},
         {"quarter", statement.quarter},
         {"user", loan.user},
         {"team", loan.team},
         {"month", loan.month},
         {"id", std::to_string(loan.id)},
         {"amount_gpu_hours", fixed_text(loan.gpu_hours, 3)},
         {"state", to_string(loan.state)},
         {"by", loan.decided_by},
         {"repaid_gpu_hours", fixed_text(loan.repaid_gpu_hours, 3)},
         {"time_utc", utc_minutes(loan.created_ms)},
         {"text", loan.justification}});
  }
  for (const auto& grant : statement.grants) {
    row({{"record", "grant"},
         {"quarter", statement.quarter},
         {"user", grant.user},
         {"team", grant.team},
         {"month", grant.month},
         {"id", std::to_string(grant.id)},
         {"amount_gpu_hours", fixed_text(grant.gpu_hours, 3)},
         {"by", grant.granted_by},
         {"time_utc", utc_minutes(grant.created_ms)},
         {"text", grant.reason}});
  }
  return out.str();
}

}  // namespace yolo8::quota
