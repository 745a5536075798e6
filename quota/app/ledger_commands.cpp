// quotad's ledger commands against a running server: loans, contribution grants and a member's balance.
#include <cstdio>
#include <memory>

#include "quota/app/admin_http.h"
#include "quota/app/command_table.h"

namespace yolo8::quota {
namespace {

using nlohmann::json;

void print_loans(const json& reply) {
  std::printf("%-5s %-10s %-14s %-8s %8s %-9s %-10s %8s %s\n", "id", "user", "team", "month", "hours", "state",
              "decided_by", "repaid", "justification");
  for (const auto& loan : reply["loans"]) {
    std::printf("%-5lld %-10s %-14s %-8s %8.1f %-9s %-10s %8.1f %s\n",
                static_cast<long long>(loan["id"].get<int64_t>()), loan["user"].get<std::string>().c_str(),
                loan["team"].get<std::string>().c_str(), loan["month"].get<std::string>().c_str(),
                loan["amount_gpu_hours"].get<double>(), loan["state"].get<std::string>().c_str(),
                loan["decided_by"].get<std::string>().c_str(), loan["repaid_gpu_hours"].get<double>(),
                loan["justification"].get<std::string>().c_str());
  }
}

void print_balance(const json& reply) {
  std::printf(
      "%s (%s), %s: allowance %.1f GPU-hours = monthly %.1f + automatic loan %.1f + loans %.1f + grants %.1f - "
      "repaying %.1f; used %.1f; balance %.1f\n",
      reply["user"].get<std::string>().c_str(), reply["team"].get<std::string>().c_str(),
      reply["month"].get<std::string>().c_str(), reply["allowance_gpu_hours"].get<double>(),
      reply["monthly_gpu_hours"].get<double>(), reply["automatic_loan_gpu_hours"].get<double>(),
      reply["loans_gpu_hours"].get<double>(), reply["grants_gpu_hours"].get<double>(),
      reply["repaying_gpu_hours"].get<double>(), reply["used_gpu_hours"].get<double>(),
      reply["balance_gpu_hours"].get<double>());
}

struct LedgerArgs {
  AdminArgs admin;
  std::string state, text, user, month, note;
  double hours = 0;
  int64_t id = 0;
};

void add_loan_decision(CLI::App& app, CommandTable& table, const std::string& verb, const char* help,
                       const char* note_help) {
  auto args = std::make_shared<LedgerArgs>();
  auto* command = app.add_subcommand(verb + "-loan", help);
  add_admin_flags(command, args->admin);
  command->add_option("id", args->id, "loan id")->required();
  command->add_option("--note", args->note, note_help);
  table.add(command, [args, verb] {
    const std::string path = "/v1/loans/" + std::to_string(args->id) + "/" + verb;
    return print_reply(args->admin, admin_call(args->admin, "POST", path, json{{"note", args->note}}.dump()));
  });
}

}  // namespace

void add_ledger_commands(CLI::App& app, CommandTable& table) {
  auto loans = std::make_shared<LedgerArgs>();
  auto* loans_cmd = app.add_subcommand("loans", "list loan applications (own; leads: the team's; admins: all)");
  add_admin_flags(loans_cmd, loans->admin);
  loans_cmd->add_option("--state", loans->state, "pending, approved, rejected, repaid or expired");
  table.add(loans_cmd, [loans] {
    const std::string query = loans->state.empty() ? "" : "?state=" + loans->state;
    return print_reply(loans->admin, admin_call(loans->admin, "GET", "/v1/loans" + query), print_loans);
  });

  auto apply = std::make_shared<LedgerArgs>();
  auto* apply_cmd = app.add_subcommand("apply-loan", "apply for GPU-hours beyond this month's allowance");
  add_admin_flags(apply_cmd, apply->admin);
  apply_cmd->add_option("hours", apply->hours, "GPU-hours")->required();
  apply_cmd->add_option("--justification", apply->text, "why (for the lead who decides)")->required();
  table.add(apply_cmd, [apply] {
    const json body{{"amount_gpu_hours", apply->hours}, {"justification", apply->text}};
    return print_reply(apply->admin, admin_call(apply->admin, "POST", "/v1/loans", body.dump()));
  });

  add_loan_decision(app, table, "approve", "approve a loan (a lead of the team or an admin)", "note for the audit log");
  add_loan_decision(app, table, "reject", "reject a loan (a lead of the team or an admin)", "reason for the audit log");

  auto grant = std::make_shared<LedgerArgs>();
  auto* grant_cmd = app.add_subcommand("grant", "grant contribution credits to a member (a lead or an admin)");
  add_admin_flags(grant_cmd, grant->admin);
  grant_cmd->add_option("user", grant->user, "member")->required();
  grant_cmd->add_option("hours", grant->hours, "GPU-hours")->required();
  grant_cmd->add_option("--reason", grant->text, "the contribution: a shared tool, a dataset, ...")->required();
  table.add(grant_cmd, [grant] {
    const json body{{"user", grant->user}, {"amount_gpu_hours", grant->hours}, {"reason", grant->text}};
    return print_reply(grant->admin, admin_call(grant->admin, "POST", "/v1/credits", body.dump()));
  });

  auto balance = std::make_shared<LedgerArgs>();
  auto* balance_cmd = app.add_subcommand("balance", "a member's allowance, use, loans and grants for a month");
  add_admin_flags(balance_cmd, balance->admin);
  balance_cmd->add_option("--user", balance->user, "member (default: the caller)");
  balance_cmd->add_option("--month", balance->month, "YYYY-MM (default: this month)");
  table.add(balance_cmd, [balance] {
    std::string query;
    if (!balance->user.empty()) query += "user=" + balance->user;
    if (!balance->month.empty()) query += (query.empty() ? "" : "&") + std::string("month=") + balance->month;
    const json reply = admin_call(balance->admin, "GET", "/v1/balance" + (query.empty() ? "" : "?" + query));
    return print_reply(balance->admin, reply, print_balance);
  });
}

}  // namespace yolo8::quota
