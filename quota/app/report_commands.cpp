// quotad's reports from the database: the monthly journal and the quarter statement (`report`), the quotas it
// recommends from history (`recommend`) and the memory table learned from the runs' peaks (`memory-table`).
#include <cctype>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <vector>

#include "common/exit_codes.h"
#include "quota/app/command_table.h"
#include "quota/core/api.h"
#include "quota/core/calendar.h"
#include "quota/core/memory_learning.h"
#include "quota/core/recommend.h"
#include "quota/server/history.h"
#include "quota/server/report.h"
#include "quota/server/statement.h"
#include "quota/store/state_store.h"

namespace yolo8::quota {
namespace {

StoreOptions read_options(const std::string& password_file) {
  StoreOptions options;
  options.password_file = password_file;
  return options;
}

struct ReportArgs {
  std::string month, quarter, format = "md", db = "quotad.db", password_file, policy, out;
  int top = 10;
};

int run_report(const ReportArgs& args) {
  if (!args.quarter.empty()) {
    if (!args.month.empty()) throw UsageError("--quarter: give either --month or --quarter, not both");
    quarter_months(args.quarter);  // names --quarter before anything else is read
    if (args.policy.empty()) throw UsageError("--policy: required with --quarter (the credit rules)");
    const QuarterStatement statement =
        build_statement(*open_report_reader(parse_db_target(args.db), read_options(args.password_file)), args.quarter,
                        load_policy(args.policy));
    const std::string text = args.format == "html"  ? statement_html(statement)
                             : args.format == "csv" ? statement_csv(statement)
                                                    : statement_markdown(statement);
    write_output(args.out, text);
    return kExitCompleted;
  }
  if (args.month.empty()) throw UsageError("--month: required (or --quarter)");
  std::unique_ptr<Policy> policy;
  if (!args.policy.empty()) policy = std::make_unique<Policy>(load_policy(args.policy));
  int64_t month_start = 0, month_end = 0;
  month_range_ms(args.month, month_start, month_end);  // names --month before the database is opened
  const MonthlyReport report =
      build_report(*open_report_reader(parse_db_target(args.db), read_options(args.password_file)), args.month,
                   policy.get(), args.top);
  const std::string text = args.format == "html"  ? report_html(report)
                           : args.format == "csv" ? report_csv(report)
                                                  : report_markdown(report);
  write_output(args.out, text);
  return kExitCompleted;
}

struct RecommendArgs {
  int months = 3;
  std::string db = "quotad.db", password_file, policy, diff, until;
};

int run_recommend(const RecommendArgs& args) {
  const Policy policy = load_policy(args.policy);
  std::ifstream policy_in(args.policy, std::ios::binary);
  const std::string policy_text((std::istreambuf_iterator<char>(policy_in)), std::istreambuf_iterator<char>());
  int64_t now = system_now_ms();
  if (!args.until.empty()) {
    int64_t month_start = 0, month_end = 0;
    const bool shape = args.until.size() == 10 && args.until[7] == '-' &&
                       std::isdigit(static_cast<unsigned char>(args.until[8])) &&
                       std::isdigit(static_cast<unsigned char>(args.until[9]));
    try {
      if (!shape) throw std::invalid_argument("shape");
      month_range_ms(args.until.substr(0, 7), month_start, month_end);
    } catch (const std::invalid_argument&) {
      throw UsageError("--until: expected YYYY-MM-DD, got '" + args.until + "'");
    }
    now = month_start + (std::stoll(args.until.substr(8, 2)) - 1) * 86400000LL;
    if (args.until.substr(8, 2) == "00" || now >= month_end) {
      throw UsageError("--until: no such day '" + args.until + "'");
    }
  }
  const UsageHistory history =
      load_history(*open_report_reader(parse_db_target(args.db), read_options(args.password_file)), policy,
                   now - static_cast<int64_t>(args.months) * 30 * 86400000LL, now);
  const Recommendation recommendation = recommend(policy, history);
  const std::string diff = policy_diff(policy_text, args.policy, policy, recommendation);
  std::printf("%s\n", recommendation_text(recommendation).c_str());
  std::printf("%s", diff.empty() ? "The policy already matches: no change proposed.\n"
                                 : ("Policy diff (apply with: patch -p0 < FILE):\n\n" + diff).c_str());
  if (!args.diff.empty()) write_output(args.diff, diff);
  return kExitCompleted;
}

struct MemoryTableArgs {
  std::string db = "quotad.db", out, device, libtorch;
  bool observed = false;
};

int run_memory_table(const MemoryTableArgs& args) {
  const DbTarget table_target = parse_db_target(args.db);
  if (table_target.kind == DbTarget::Kind::kSqlite && !std::filesystem::exists(table_target.location)) {
    throw std::runtime_error(args.db + ": no such database");
  }
  const std::vector<ObservedRow> all = fit_observed(open_store(table_target)->memory_observations());
  // one table per device, precision and LibTorch version (an upgrade can change what a batch needs)
  std::map<std::string, std::vector<ObservedRow>> by_table;
  for (const auto& row : all) {
    if ((args.device.empty() || row.device == args.device) && (args.libtorch.empty() || row.libtorch == args.libtorch ||
                                                               (args.libtorch == "unknown" && row.libtorch.empty()))) {
      by_table[row.device + (row.amp ? ", amp" : ", float32") + ", LibTorch " +
               (row.libtorch.empty() ? "unknown" : row.libtorch)]
          .push_back(row);
    }
  }
  if (by_table.size() != 1) {
    std::string found;
    for (const auto& [name, rows] : by_table) found += "\n  " + name;
    std::fprintf(stderr, "quotad memory-table: %s%s\n",
                 by_table.empty() ? "no memory observations"
                                  : "observations from several devices, precisions or LibTorch versions; "
                                    "choose one with --device and --libtorch:",
                 found.c_str());
    return kExitBadInput;
  }
  const int64_t now = system_now_ms();
  const std::time_t seconds = static_cast<std::time_t>(now / 1000);
  char day[16];
  std::strftime(day, sizeof(day), "%Y-%m-%d", std::gmtime(&seconds));
  // heartbeats' peaks say nothing of the per-process overhead (`yolo8 profile` measures it): a table being
  // replaced keeps its figure when it was measured on the same device
  double overhead = -1;
  const std::string& device = by_table.begin()->second.front().device;
  if (!args.out.empty() && std::filesystem::exists(args.out)) {
    try {
      const MemoryTable previous = load_memory_table(args.out);
      if (previous.process_overhead_gib >= 0 &&
          (previous.provenance.device.empty() || previous.provenance.device == device)) {
        overhead = previous.process_overhead_gib;
        std::fprintf(stderr, "quotad memory-table: kept process_overhead_gib %.2f from %s\n", overhead,
                     args.out.c_str());
      } else if (previous.process_overhead_gib >= 0) {
        std::fprintf(stderr, "quotad memory-table: dropped process_overhead_gib %.2f of %s: measured on %s, not %s\n",
                     previous.process_overhead_gib, args.out.c_str(), previous.provenance.device.c_str(),
                     device.c_str());
      }
    } catch (const PolicyError&) {
      // not a memory table: replaced as before
    }
  }
  const std::string text = observed_table_yaml(by_table.begin()->second, day, overhead);
  if (by_table.begin()->second.front().libtorch.empty()) {
    std::fprintf(stderr,
                 "quotad memory-table: these runs did not report their LibTorch version (trainers before it "
                 "was sent); the table's provenance leaves it out\n");
  }
  for (const auto& row : by_table.begin()->second) {
    std::fprintf(stderr, "%s on %s: %.3f GiB + %.4f GiB per image at 640 from %d runs\n", row.model.c_str(),
                 row.device.c_str(), row.fixed_gib, row.per_image_gib, row.samples);
  }
  write_output(args.out, text);
  return kExitCompleted;
}

}  // namespace

void add_report_commands(CLI::App& app, CommandTable& table) {
  auto report = std::make_shared<ReportArgs>();
  auto* report_cmd = app.add_subcommand(
      "report", "monthly usage journal per team (--month), or the quarter-end statement per member (--quarter)");
  report_cmd->add_option("--month", report->month, "YYYY-MM (UTC)");
  report_cmd->add_option("--quarter", report->quarter,
                         "YYYY-Qn: balances, loans, grants and a ranking (needs --policy)");
  report_cmd->add_option("--format", report->format, "md, html or csv")
      ->check(CLI::IsMember({"md", "html", "csv"}))
      ->capture_default_str();
  report_cmd->add_option("--db", report->db, "quotad's database: a SQLite file or a PostgreSQL URL")
      ->capture_default_str();
  report_cmd->add_option("--db-password-file", report->password_file, "PostgreSQL: the password's file");
  report_cmd->add_option("--policy", report->policy, "policy YAML: teams, credit allowances, waste thresholds");
  report_cmd->add_option("--out", report->out, "write to this file instead of stdout");
  report_cmd->add_option("--top", report->top, "top jobs listed")->check(CLI::Range(1, 1000))->capture_default_str();
  table.add(report_cmd, [report] { return run_report(*report); });

  auto memory = std::make_shared<MemoryTableArgs>();
  auto* table_cmd = app.add_subcommand(
      "memory-table", "write a memory table (the policy's schema) learned from the peaks real runs reported");
  table_cmd->add_flag("--observed", memory->observed, "from the heartbeats' memory observations (required)")
      ->required();
  table_cmd->add_option("--db", memory->db, "quotad's SQLite database")->capture_default_str();
  table_cmd->add_option("--device", memory->device, "the device whose table to write (when several reported)");
  table_cmd->add_option("--libtorch", memory->libtorch,
                        "the LibTorch version whose table to write (when runs reported several; "
                        "'unknown': the runs that did not say)");
  table_cmd->add_option("--out", memory->out, "write to this file instead of stdout");
  table.add(table_cmd, [memory] { return run_memory_table(*memory); });

  auto recommendation = std::make_shared<RecommendArgs>();
  auto* recommend_cmd = app.add_subcommand(
      "recommend", "propose base and burst per team from the recorded history, with the figures and a policy diff");
  recommend_cmd->add_option("--months", recommendation->months, "history to read: the last N x 30 days")
      ->check(CLI::Range(1, 36))
      ->capture_default_str();
  recommend_cmd->add_option("--db", recommendation->db, "quotad's database: a SQLite file or a PostgreSQL URL")
      ->capture_default_str();
  recommend_cmd->add_option("--db-password-file", recommendation->password_file, "PostgreSQL: the password's file");
  recommend_cmd->add_option("--policy", recommendation->policy, "the policy file the diff applies to")->required();
  recommend_cmd->add_option("--until", recommendation->until,
                            "YYYY-MM-DD (UTC): the window ends at that midnight (default: now)");
  recommend_cmd->add_option("--diff", recommendation->diff,
                            "also write the diff alone to this file (patch -p0 < FILE)");
  table.add(recommend_cmd, [recommendation] { return run_recommend(*recommendation); });
}

}  // namespace yolo8::quota
