// quotad's admin commands against a running server: teams, leases, approvals and the audit log (whose --verify
// reads the database itself).
#include <cstdio>
#include <ctime>
#include <memory>

#include "common/exit_codes.h"
#include "quota/app/admin_http.h"
#include "quota/app/command_table.h"
#include "quota/store/store.h"

namespace yolo8::quota {
namespace {

using nlohmann::json;

std::string fmt_ms(int64_t ms) {
  if (ms <= 0) return "-";
  const time_t seconds = static_cast<time_t>(ms / 1000);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%d %H:%M:%S", std::gmtime(&seconds));
  return text;
}

void print_teams(const json& reply) {
  std::printf("%-16s %6s %6s %6s %7s %6s %7s %8s\n", "team", "base", "burst", "limit", "in_use", "active", "queued",
              "approval");
  for (const auto& team : reply["teams"]) {
    std::printf("%-16s %6.1f %6.1f %6.1f %7.2f %6d %7d %8d\n", team["name"].get<std::string>().c_str(),
                team["base"].get<double>(), team["burst"].get<double>(), team["limit_now"].get<double>(),
                team["gpus_in_use"].get<double>(), team["leases_active"].get<int>(), team["queued"].get<int>(),
                team["pending_approval"].get<int>());
  }
  std::printf("total GPUs %d, emergency pool %d\n", reply["total_gpus"].get<int>(),
              reply["emergency_pool_gpus"].get<int>());
}

void print_leases(const json& reply) {
  std::printf("%-6s %-16s %-8s %-14s %-9s %-8s %4s %-20s %s\n", "id", "state", "user", "team", "model", "priority",
              "gpus", "devices", "reason");
  for (const auto& lease : reply["leases"]) {
    std::string devices;
    for (const auto& device : lease["devices"]) devices += (devices.empty() ? "" : ",") + device.get<std::string>();
    const auto& request = lease["request"];
    std::printf("%-6lld %-16s %-8s %-14s %-9s %-8s %4d %-20s %s\n", static_cast<long long>(lease["id"].get<int64_t>()),
                lease["state"].get<std::string>().c_str(), request["user"].get<std::string>().c_str(),
                request["team"].get<std::string>().c_str(), request["model"].get<std::string>().c_str(),
                request["priority"].get<std::string>().c_str(), lease["gpus"].get<int>(), devices.c_str(),
                lease.value("reason", "").c_str());
  }
}

void print_audit(const json& reply) {
  for (const auto& entry : reply["audit"]) {
    std::printf("%6lld %s %-10s %-18s lease=%-5lld %-14s %s\n", static_cast<long long>(entry["seq"].get<int64_t>()),
                fmt_ms(entry["ts_ms"].get<int64_t>()).c_str(), entry["actor"].get<std::string>().c_str(),
                entry["action"].get<std::string>().c_str(), static_cast<long long>(entry["lease_id"].get<int64_t>()),
                entry["team"].get<std::string>().c_str(), entry["detail"].get<std::string>().c_str());
  }
}

struct DecisionArgs {
  AdminArgs admin;
  int64_t id = 0;
  std::string note;
};

void add_decision(CLI::App& app, CommandTable& table, const std::string& verb, const char* help,
                  const char* note_help) {
  auto args = std::make_shared<DecisionArgs>();
  auto* command = app.add_subcommand(verb, help);
  add_admin_flags(command, args->admin);
  command->add_option("id", args->id, "approval id")->required();
  command->add_option("--note", args->note, note_help);
  table.add(command, [args, verb] {
    const json reply = admin_call(args->admin, "POST", "/v1/approvals/" + std::to_string(args->id) + "/" + verb,
                                  json{{"note", args->note}}.dump());
    return print_reply(args->admin, reply, [&](const json& decided) {
      std::printf("approval %lld: %s by %s; lease %lld is %s\n", static_cast<long long>(args->id),
                  decided["state"].get<std::string>().c_str(), decided["decided_by"].get<std::string>().c_str(),
                  static_cast<long long>(decided["lease_id"].get<int64_t>()),
                  decided["lease"]["state"].get<std::string>().c_str());
    });
  });
}

struct AuditArgs {
  AdminArgs admin;
  int64_t after = 0;
  int limit = 100;
  bool verify = false;
  std::string db = "quotad.db";
  std::string password_file;
};

int verify_audit(const AuditArgs& args) {
  StoreOptions options;
  options.password_file = args.password_file;
  const AuditChainCheck check = verify_audit_chain(parse_db_target(args.db), options);
  if (!check.intact) {
    std::printf("quotad audit --verify: %s: the chain is broken at %s\n", args.db.c_str(), check.problem.c_str());
    return kExitFailure;
  }
  std::printf("quotad audit --verify: %s: %lld entries, chain intact", args.db.c_str(),
              static_cast<long long>(check.entries));
  if (check.unchained > 0) {
    std::printf(" (the first %lld written before the chain existed)", static_cast<long long>(check.unchained));
  }
  if (check.head_seq > 0) {
    std::printf("; head: entry %lld sha256 %s", static_cast<long long>(check.head_seq), check.head.c_str());
  }
  std::printf("\n");
  for (const std::string& gap : check.recorded_gaps) std::printf("  recorded gap: %s\n", gap.c_str());
  return kExitCompleted;
}

}  // namespace

void add_admin_commands(CLI::App& app, CommandTable& table) {
  auto teams = std::make_shared<AdminArgs>();
  auto* teams_cmd = app.add_subcommand("teams", "usage per team");
  add_admin_flags(teams_cmd, *teams);
  table.add(teams_cmd, [teams] { return print_reply(*teams, admin_call(*teams, "GET", "/v1/teams"), print_teams); });

  struct LeasesArgs {
    AdminArgs admin;
    std::string state;
  };
  auto leases = std::make_shared<LeasesArgs>();
  auto* leases_cmd = app.add_subcommand("leases", "list leases");
  add_admin_flags(leases_cmd, leases->admin);
  leases_cmd->add_option("--state", leases->state, "only this state (default: unfinished ones)");
  table.add(leases_cmd, [leases] {
    const std::string query = leases->state.empty() ? "" : "?state=" + leases->state;
    return print_reply(leases->admin, admin_call(leases->admin, "GET", "/v1/leases" + query), print_leases);
  });

  add_decision(app, table, "approve", "approve a request (team lead or admin)", "note for the audit log");
  add_decision(app, table, "reject", "reject a request (team lead or admin)", "reason for the audit log");

  auto approvals = std::make_shared<AdminArgs>();
  auto* approvals_cmd = app.add_subcommand("approvals", "list approval requests");
  add_admin_flags(approvals_cmd, *approvals);
  table.add(approvals_cmd,
            [approvals] { return print_reply(*approvals, admin_call(*approvals, "GET", "/v1/approvals")); });

  auto audit = std::make_shared<AuditArgs>();
  auto* audit_cmd = app.add_subcommand("audit", "print the audit log");
  add_admin_flags(audit_cmd, audit->admin);
  audit_cmd->add_option("--after", audit->after, "only entries after this sequence number");
  audit_cmd->add_option("--limit", audit->limit, "at most this many entries")->check(CLI::Range(1, 1000));
  audit_cmd->add_flag("--verify", audit->verify,
                      "recompute the audit log's hash chain from the database (read-only) and name the first broken "
                      "entry; exit 1 when broken");
  audit_cmd->add_option("--db", audit->db, "with --verify: quotad's database (a SQLite file or a PostgreSQL URL)")
      ->capture_default_str();
  audit_cmd->add_option("--db-password-file", audit->password_file, "with --verify on PostgreSQL: the password's file");
  table.add(audit_cmd, [audit] {
    if (audit->verify) return verify_audit(*audit);
    const std::string path =
        "/v1/audit?after=" + std::to_string(audit->after) + "&limit=" + std::to_string(audit->limit);
    return print_reply(audit->admin, admin_call(audit->admin, "GET", path), print_audit);
  });
}

}  // namespace yolo8::quota
