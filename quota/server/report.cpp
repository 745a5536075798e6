#include "quota/server/report.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iomanip>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>

#include "quota/core/api.h"
#include "quota/core/calendar.h"
#include "quota/core/codec.h"
#include "quota/server/history.h"
#include "quota/server/journal_advice.h"
#include "quota/server/metrics.h"
#include "quota/server/statement.h"
#include "quota/server/status_page.h"
#include "quota/store/store.h"

namespace yolo8::quota {

namespace {

int64_t lease_end_ms(const Lease& lease) {
  if (is_terminal(lease.state)) return lease.ended_ms;
  return std::max(lease.charged_until_ms, lease.last_seen_ms);
}

// GPUs (or memory share) charged per hour; derived from the charged hours when the policy cannot resolve it.
double lease_units(const Lease& lease, const Policy* policy) {
  if (!lease.shared) return lease.gpus;
  if (policy != nullptr && !policy->gpus.empty()) return lease.units(*policy);
  const int64_t charged = lease.charged_until_ms - lease.granted_ms;
  return charged > 0 ? lease.gpu_hours / (static_cast<double>(charged) / 3.6e6) : 0;
}

double overlap_hours(const Lease& lease, int64_t from, int64_t to) {
  if (lease.granted_ms <= 0) return 0;
  const int64_t start = std::max(lease.granted_ms, from);
  const int64_t end = std::min(lease_end_ms(lease), to);
  return end > start ? static_cast<double>(end - start) / 3.6e6 : 0;
}

struct MonthData {
  std::map<int64_t, LeaseUtil> util;  // per lease, samples inside the month only
};

MonthData read_samples(ReportReader& reader, int64_t from, int64_t to, const std::map<int64_t, Lease>& leases,
                       double below, int64_t after_ms) {
  UtilTracker tracker(below, after_ms);
  reader.fold_util(from, to, tracker);  // months are whole hours: the same whether their heartbeats were folded
  MonthData out;
  for (const auto& [id, util] : tracker.leases()) {
    // a low run lasts until the lease ended (inside the month) or the last sample
    auto it = leases.find(id);
    int64_t end = util.last_ts_ms;
    if (it != leases.end() && is_terminal(it->second.state) && it->second.ended_ms > 0) {
      end = std::clamp(it->second.ended_ms, util.last_ts_ms, to);
    }
    tracker.close(id, end);
    out.util[id] = *tracker.find(id);
  }
  return out;
}

std::string percent(double value) { return value < 0 ? "-" : fixed_text(100 * value, 0) + " %"; }

std::string pct_change(double current, double prev) {
  if (current < 0 || prev < 0) return "-";
  const double change = 100 * (current - prev);
  return (change >= 0 ? "+" : "") + fixed_text(change, 0) + " pts";
}

std::string hours_change(double current, double prev) {
  if (prev <= 0) return current > 0 ? "new" : "-";
  const double change = 100 * (current - prev) / prev;
  return (change >= 0 ? "+" : "") + fixed_text(change, 0) + " %";
}

// Markdown table cells must not break the row.
std::string markdown_cell(const std::string& text) {
  std::string out;
  for (char character : text) {
    if (character == '|') {
      out += "\\|";
    } else if (character == '\n' || character == '\r') {
      out += ' ';
    } else {
      out += character;
    }
  }
  return out;
}

}  // namespace

void month_range_ms(const std::string& month, int64_t& start_ms, int64_t& end_ms) {
  const std::optional<MonthSpan> span = month_span(month);
  if (!span) throw std::invalid_argument("--month: expected YYYY-MM, got '" + month + "'");
  start_ms = span->start_ms;
  end_ms = span->end_ms;
}

MonthlyReport build_report(const std::string& db, const std::string& month, const Policy* policy, int top_n,
                           int64_t now_ms) {
  int64_t from = 0, to = 0;
  month_range_ms(month, from, to);  // validates before anything is opened
  const std::unique_ptr<ReportReader> reader = open_report_reader(parse_db_target(db));
  return build_report(*reader, month, policy, top_n, now_ms);
}

MonthlyReport build_report(ReportReader& reader, const std::string& month, const Policy* policy, int top_n,
                           int64_t now_ms) {
  MonthlyReport report;
  report.month = month;
  int64_t from = 0, to = 0, pfrom = 0, pto = 0;
  month_range_ms(month, from, to);  // validates before anything parses it
  report.month_start_ms = from;
  report.month_end_ms = to;
  report.generated_ms =
      now_ms > 0
          ? now_ms
          : std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
                .count();
  report.prev_month = previous_month_key(month);
  month_range_ms(report.prev_month, pfrom, pto);
  if (policy != nullptr) {
    report.waste_util_below = policy->waste_gpu_util_below;
    report.waste_after_s = policy->waste_after_s;
  }

  // leases that may overlap the two months
  std::map<int64_t, Lease> leases;
  for (Lease& lease : reader.leases_since(pfrom)) {
    if (lease.granted_ms > 0 && lease.granted_ms < to) leases[lease.id] = std::move(lease);
  }
  const int64_t after_ms = static_cast<int64_t>(report.waste_after_s) * 1000;
  const MonthData cur = read_samples(reader, from, to, leases, report.waste_util_below, after_ms);
  const MonthData prev = read_samples(reader, pfrom, pto, leases, report.waste_util_below, after_ms);

  auto team_of_user = [&](const std::string& user, const std::string& fallback) {
    if (policy != nullptr) {
      auto it = policy->users.find(user);
      if (it != policy->users.end() && !it->second.team.empty()) return it->second.team;
    }
    return fallback;
  };

  std::map<std::string, ReportTeam> teams;
  if (policy != nullptr) {
    for (const auto& [name, team] : policy->teams) teams[name].team = name;
  }
  struct UtilSum {
    double weight = 0, sum = 0;
  };
  std::map<std::string, UtilSum> util_cur, util_prev;
  std::map<std::string, ReportWaste> waste;
  std::vector<ReportJob> jobs;
  for (const auto& [id, lease] : leases) {
    const double units = lease_units(lease, policy);
    const double h_cur = overlap_hours(lease, from, to) * units;
    const double h_prev = overlap_hours(lease, pfrom, pto) * units;
    ReportTeam& team = teams[lease.req.team];
    team.team = lease.req.team;
    team.gpu_hours += h_cur;
    team.prev_gpu_hours += h_prev;
    if (auto it = cur.util.find(id); it != cur.util.end() && it->second.covered_ms > 0) {
      util_cur[lease.req.team].weight += units * static_cast<double>(it->second.covered_ms);
      util_cur[lease.req.team].sum += units * it->second.util_ms();
    }
    if (auto it = prev.util.find(id); it != prev.util.end() && it->second.covered_ms > 0) {
      util_prev[lease.req.team].weight += units * static_cast<double>(it->second.covered_ms);
      util_prev[lease.req.team].sum += units * it->second.util_ms();
    }
    if (h_cur <= 0) continue;
    ++team.leases;
    ReportJob job;
    job.lease_id = id;
    job.team = lease.req.team;
    job.user = lease.req.user;
    job.job = lease.req.job;
    job.model = lease.req.model;
    job.state = lease.state;
    job.outcome = lease.outcome;
    job.gpus = units;
    job.gpu_hours = h_cur;
    job.duration_ms = lease_end_ms(lease) - lease.granted_ms;
    job.whole_gpus = lease.gpus;
    job.shared = lease.shared;
    job.may_share = policy != nullptr && policy->shared_refusal(lease.req.model, 1).empty();
    job.memory_gib = lease.memory_gib;
    job.peak_memory_gib = lease.telemetry.memory_used_gib;
    job.process_memory_gib = lease.telemetry.process_memory_used_gib;
    job.device_memory_gib = lease.telemetry.device_memory_used_gib;
    job.batch = lease.telemetry.batch;
    job.imgsz = lease.telemetry.imgsz > 0 ? lease.telemetry.imgsz : lease.req.imgsz;
    if (auto it = cur.util.find(id); it != cur.util.end()) {
      job.avg_util = it->second.avg_util();
      if (it->second.wasted_ms > 0) {
        ReportWaste& waste_row = waste[lease.req.user];
        waste_row.user = lease.req.user;
        waste_row.team = lease.req.team;
        waste_row.wasted_gpu_hours += units * static_cast<double>(it->second.wasted_ms) / 3.6e6;
        ++waste_row.leases;
        waste_row.longest_low_ms = std::max(waste_row.longest_low_ms, it->second.longest_low_ms);
        team.wasted_gpu_hours += units * static_cast<double>(it->second.wasted_ms) / 3.6e6;
      }
    }
    jobs.push_back(job);
  }
  for (auto& [name, team] : teams) {
    if (util_cur.count(name)) team.avg_util = util_cur[name].sum / util_cur[name].weight;
    if (util_prev.count(name)) team.prev_avg_util = util_prev[name].sum / util_prev[name].weight;
    report.total_gpu_hours += team.gpu_hours;
    report.prev_total_gpu_hours += team.prev_gpu_hours;
    report.teams.push_back(team);
  }
  std::stable_sort(report.teams.begin(), report.teams.end(),
                   [](const ReportTeam& left, const ReportTeam& right) { return left.gpu_hours > right.gpu_hours; });
  std::stable_sort(jobs.begin(), jobs.end(),
                   [](const ReportJob& left, const ReportJob& right) { return left.gpu_hours > right.gpu_hours; });
  report.jobs = jobs;
  if (static_cast<int>(jobs.size()) > top_n) jobs.resize(static_cast<size_t>(std::max(0, top_n)));
  report.top_jobs = std::move(jobs);
  for (auto& [user_name, waste_row] : waste) report.waste.push_back(waste_row);
  std::stable_sort(report.waste.begin(), report.waste.end(), [](const ReportWaste& left, const ReportWaste& right) {
    return left.wasted_gpu_hours > right.wasted_gpu_hours;
  });

  // credits: quotad's own usage ledger (charged to the month the time was billed in)
  const std::map<std::pair<std::string, std::string>, double> usage = reader.usage({month, report.prev_month});
  std::map<std::string, std::string> members;  // user -> team
  if (policy != nullptr) {
    for (const auto& [name, team] : policy->teams) {
      for (const auto& member_name : team.members) members[member_name] = name;
      for (const auto& member_name : team.leads) members[member_name] = name;
    }
  }
  for (const auto& [key, hours] : usage) {
    if (key.second == month && !members.count(key.first)) members[key.first] = team_of_user(key.first, "");
  }
  for (const auto& [id, lease] : leases) {
    if (members.count(lease.req.user) && members[lease.req.user].empty()) members[lease.req.user] = lease.req.team;
  }
  // loans and grants raise allowances; the tables are small (a few records per member and month)
  const LedgerTotals ledger = ledger_totals(reader.loans(), reader.grants());
  for (const auto& [user, team] : members) {
    ReportCredit credit;
    credit.user = user;
    credit.team = team;
    auto it = usage.find({user, month});
    credit.used = it == usage.end() ? 0 : it->second;
    auto before = usage.find({user, report.prev_month});
    credit.prev_used = before == usage.end() ? 0 : before->second;
    if (policy != nullptr && policy->monthly_gpu_hours > 0) {
      auto previous = usage.find({user, report.prev_month});
      credit.allowance =
          month_credit(*policy, previous == usage.end() ? 0 : previous->second, ledger.grant(user, report.prev_month),
                       ledger.loan(user, month), ledger.grant(user, month))
              .allowance();
    }
    report.credits.push_back(credit);
  }
  std::stable_sort(report.credits.begin(), report.credits.end(),
                   [](const ReportCredit& left, const ReportCredit& right) {
                     return left.team != right.team ? left.team < right.team : left.user < right.user;
                   });

  // emergency uses, with the admin's review when there is one
  std::map<int64_t, std::string> reviews;
  for (const AuditEntry& entry : reader.audit("emergency.reviewed")) {
    reviews[entry.lease_id] = "reviewed by " + entry.actor + ": " + entry.detail;
  }
  for (const auto& [id, lease] : leases) {
    if (!lease.emergency || lease.granted_ms < from || lease.granted_ms >= to) continue;
    ReportEmergency emergency;
    emergency.lease_id = id;
    emergency.team = lease.req.team;
    emergency.user = lease.req.user;
    emergency.job = lease.req.job;
    emergency.justification = lease.req.justification;
    emergency.granted_ms = lease.granted_ms;
    emergency.gpus = lease_units(lease, policy);
    emergency.gpu_hours = overlap_hours(lease, from, to) * emergency.gpus;
    auto it = reviews.find(id);
    emergency.review = it != reviews.end() ? it->second : (lease.review_pending ? "pending" : "closed");
    report.emergencies.push_back(emergency);
  }

  // what the advice weighs beyond the month's rows: the GPU sizes on offer and the quotas the month argues for
  if (policy != nullptr) {
    std::set<double> sizes;
    for (const Gpu& gpu : policy->gpus) sizes.insert(gpu.memory_gib);
    report.gpu_memory_sizes.assign(sizes.begin(), sizes.end());
    if (!policy->teams.empty()) {
      const int64_t until = std::min(to, report.generated_ms);
      if (until > from) report.recommended = recommend(*policy, load_history(reader, *policy, from, until)).teams;
    }
  }
  return report;
}

std::string lease_outcome(LeaseState state, Outcome outcome) {
  switch (state) {
    case LeaseState::kGranted: return "running";
    case LeaseState::kRevoking: return "revoking";
    case LeaseState::kReleased: return outcome == Outcome::kNone ? "released" : to_string(outcome);
    case LeaseState::kExpired:
      // a victim that did not release before its preemption deadline ends expired with outcome preempted
      if (outcome == Outcome::kPreempted) return "revoked (deadline passed)";
      return outcome == Outcome::kNone ? "expired (no heartbeat)" : "expired (" + to_string(outcome) + ")";
    default: return to_string(state);
  }
}

std::vector<double> round_to_total(const std::vector<double>& values, int digits) {
  const double scale = std::pow(10.0, digits);
  std::vector<long long> units(values.size());
  std::vector<std::pair<double, size_t>> remainders;
  double sum = 0;
  long long floors = 0;
  for (size_t i = 0; i < values.size(); ++i) {
    const double scaled = values[i] * scale;
    sum += scaled;
    units[i] = static_cast<long long>(std::floor(scaled + 1e-9));
    floors += units[i];
    remainders.push_back({scaled - static_cast<double>(units[i]), i});
  }
  // hand the units the floors lost to the largest remainders (ties: the earlier row)
  std::stable_sort(remainders.begin(), remainders.end(),
                   [](const auto& left, const auto& right) { return left.first > right.first; });
  long long missing = std::llround(sum) - floors;
  for (size_t i = 0; i < remainders.size() && missing > 0; ++i, --missing) ++units[remainders[i].second];
  std::vector<double> out(values.size());
  for (size_t i = 0; i < values.size(); ++i) out[i] = static_cast<double>(units[i]) / scale;
  return out;
}

namespace {

// The team GPU-hours as shown (rounded so that they add up to the shown total), this month and the previous one.
struct ShownHours {
  std::vector<double> current, previous, idle;
  double total = 0, prev_total = 0, idle_total = 0;
  int leases = 0;
};

ShownHours shown_hours(const MonthlyReport& report, int digits) {
  std::vector<double> current, previous, idle;
  ShownHours shown;
  for (const auto& team : report.teams) {
    current.push_back(team.gpu_hours);
    previous.push_back(team.prev_gpu_hours);
    idle.push_back(team.wasted_gpu_hours);
    shown.leases += team.leases;
  }
  shown.current = round_to_total(current, digits);
  shown.previous = round_to_total(previous, digits);
  shown.idle = round_to_total(idle, digits);
  for (double value : shown.current) shown.total += value;
  for (double value : shown.previous) shown.prev_total += value;
  for (double value : shown.idle) shown.idle_total += value;
  return shown;
}

std::string month_note(const MonthlyReport& report) {
  std::string note = "Generated at " + utc_minutes(report.generated_ms) + " UTC.";
  if (report.month_in_progress()) {
    note += " The month is still running (it ends " + utc_minutes(report.month_end_ms) +
            " UTC): the figures cover its start up to the generation time, running leases included.";
  }
  return note;
}

std::string suggestion_kind(SuggestionKind kind) {
  switch (kind) {
    case SuggestionKind::kUnderusedJob: return "underused job";
    case SuggestionKind::kQuota: return "quota";
    case SuggestionKind::kCredit: return "credit";
  }
  return "";
}

std::string typical_run(const ReportJob& job) {
  std::string text = "lease " + std::to_string(job.lease_id) + " " + job.job + " (" + job.user +
                     "): " + percent(job.avg_util) + ", " + gpus_text(job.gpus) +
                     (job.gpus == 1 ? " GPU, " : " GPUs, ") + fixed_text(job.gpu_hours, 1) + " GPU-h";
  if (job.batch > 0) text += ", batch " + std::to_string(job.batch);
  if (job.imgsz > 0) text += " at " + std::to_string(job.imgsz) + " px";
  return text;
}

// The journal's advice: suggestions with their evidence, the biggest savings, and the month's typical cases.
void write_advice_markdown(const MonthlyReport& report, const JournalAdvice& advice, std::ostream& stream) {
  stream << "\n## Suggestions\n\n";
  if (advice.suggestions.empty()) {
    stream << "Nothing to suggest: no job stayed below " << fixed_text(100 * report.waste_util_below, 0)
           << " % GPU utilisation for " << format_duration_ms(static_cast<int64_t>(report.waste_after_s) * 1000)
           << " or more, the quotas fit the month's use, and no member is near the credit.\n";
  } else {
    stream << "Computed from this month's figures; the evidence is what each suggestion rests on.\n\n"
           << "| kind | about | suggestion | evidence |\n|---|---|---|---|\n";
    for (const Suggestion& s : advice.suggestions) {
      stream << "| " << suggestion_kind(s.kind) << " | " << markdown_cell(s.subject) << " | " << markdown_cell(s.advice)
             << " | " << markdown_cell(s.evidence) << " |\n";
    }
  }
  if (!advice.savings.empty()) {
    double before = 0, after = 0;
    for (const Suggestion& s : advice.savings) {
      before += s.gpu_hours;
      after += s.gpu_hours_after;
    }
    stream << "\n## Biggest savings\n\nThese runs would have cost " << fixed_text(after, 1) << " GPU-hours instead of "
           << fixed_text(before, 1) << " with the suggestion above.\n\n"
           << "| about | GPU-hours | with the suggestion | saved |\n|---|---:|---:|---:|\n";
    for (const Suggestion& s : advice.savings) {
      stream << "| " << markdown_cell(s.subject) << " | " << fixed_text(s.gpu_hours, 1) << " | "
             << fixed_text(s.gpu_hours_after, 1) << " | " << fixed_text(s.saving(), 1) << " |\n";
    }
  }
  stream << "\n## Typical cases\n\n";
  if (advice.typical_cases.empty()) {
    stream << "No run reported its GPU utilisation this month.\n";
  } else {
    stream << "The most and the least efficient run of each model (mean GPU utilisation).\n\n"
           << "| model | runs | most efficient | least efficient |\n|---|---:|---|---|\n";
    for (const TypicalCase& c : advice.typical_cases) {
      stream << "| " << markdown_cell(c.model) << " | " << c.runs << " | "
             << markdown_cell(typical_run(c.most_efficient)) << " | "
             << (c.runs == 1 ? std::string("(the only run)")
                 : c.least_efficient.avg_util == c.most_efficient.avg_util
                     ? "(every run at " + percent(c.least_efficient.avg_util) + ")"
                     : markdown_cell(typical_run(c.least_efficient)))
             << " |\n";
    }
  }
}

}  // namespace

std::string report_markdown(const MonthlyReport& report) {
  const ShownHours shown = shown_hours(report, 1);
  std::ostringstream stream;
  stream << "# GPU usage journal " << report.month << "\n\n";
  stream << month_note(report) << "\n\n";
  stream << "Total: **" << fixed_text(shown.total, 1) << " GPU-hours** (" << report.prev_month << ": "
         << fixed_text(shown.prev_total, 1) << ", " << hours_change(report.total_gpu_hours, report.prev_total_gpu_hours)
         << "). Team rows are rounded so that they add up to the totals.\n\n";
  stream << "## Teams\n\n| team | GPU-hours | vs " << report.prev_month
         << " | leases | GPU utilisation | change | idle GPU-hours |\n|---|---:|---:|---:|---:|---:|---:|\n";
  for (size_t i = 0; i < report.teams.size(); ++i) {
    const ReportTeam& team = report.teams[i];
    stream << "| " << markdown_cell(team.team) << " | " << fixed_text(shown.current[i], 1) << " | "
           << hours_change(team.gpu_hours, team.prev_gpu_hours) << " | " << team.leases << " | "
           << percent(team.avg_util) << " | " << pct_change(team.avg_util, team.prev_avg_util) << " | "
           << fixed_text(shown.idle[i], 1) << " |\n";
  }
  stream << "| **total** | **" << fixed_text(shown.total, 1) << "** | "
         << hours_change(report.total_gpu_hours, report.prev_total_gpu_hours) << " | **" << shown.leases
         << "** | | | **" << fixed_text(shown.idle_total, 1) << "** |\n";
  write_advice_markdown(report, advise(report), stream);
  stream << "\n## Top jobs\n\n";
  if (report.top_jobs.empty()) {
    stream << "No job ran this month.\n";
  } else {
    stream << "| lease | team | user | job | model | GPUs | GPU-hours | duration | GPU utilisation | outcome |\n"
           << "|---:|---|---|---|---|---:|---:|---:|---:|---|\n";
    for (const auto& job : report.top_jobs) {
      stream << "| " << job.lease_id << " | " << markdown_cell(job.team) << " | " << markdown_cell(job.user) << " | "
             << markdown_cell(job.job) << " | " << markdown_cell(job.model) << " | " << gpus_text(job.gpus) << " | "
             << fixed_text(job.gpu_hours, 1) << " | " << format_duration_ms(job.duration_ms) << " | "
             << percent(job.avg_util) << " | " << lease_outcome(job.state, job.outcome) << " |\n";
    }
  }
  stream << "\n## Waste leaderboard\n\nTime spent below " << fixed_text(100 * report.waste_util_below, 0)
         << " % GPU utilisation in stretches of at least "
         << format_duration_ms(static_cast<int64_t>(report.waste_after_s) * 1000) << ", times the GPUs held.\n\n";
  if (report.waste.empty()) {
    stream << "Nobody left GPUs idle this month.\n";
  } else {
    stream
        << "| rank | user | team | idle GPU-hours | leases | longest idle stretch |\n|---:|---|---|---:|---:|---:|\n";
    int rank = 0;
    for (const auto& waste_row : report.waste) {
      stream << "| " << ++rank << " | " << markdown_cell(waste_row.user) << " | " << markdown_cell(waste_row.team)
             << " | " << fixed_text(waste_row.wasted_gpu_hours, 1) << " | " << waste_row.leases << " | "
             << format_duration_ms(waste_row.longest_low_ms) << " |\n";
    }
  }
  stream << "\n## Credits\n\n| user | team | used GPU-hours | allowance | balance |\n|---|---|---:|---:|---:|\n";
  for (const auto& credit : report.credits) {
    stream << "| " << markdown_cell(credit.user) << " | " << markdown_cell(credit.team) << " | "
           << fixed_text(credit.used, 1) << " | " << (credit.allowance < 0 ? "-" : fixed_text(credit.allowance, 1))
           << " | " << (credit.allowance < 0 ? "-" : fixed_text(credit.balance(), 1)) << " |\n";
  }
  stream << "\n## Emergency uses\n\n";
  if (report.emergencies.empty()) {
    stream << "None.\n";
  } else {
    stream << "| lease | granted (UTC) | team | user | job | GPUs | GPU-hours | justification | review |\n"
           << "|---:|---|---|---|---|---:|---:|---|---|\n";
    for (const auto& emergency : report.emergencies) {
      stream << "| " << emergency.lease_id << " | " << utc_minutes(emergency.granted_ms) << " | "
             << markdown_cell(emergency.team) << " | " << markdown_cell(emergency.user) << " | "
             << markdown_cell(emergency.job) << " | " << gpus_text(emergency.gpus) << " | "
             << fixed_text(emergency.gpu_hours, 1) << " | " << markdown_cell(emergency.justification) << " | "
             << markdown_cell(emergency.review) << " |\n";
    }
  }
  return stream.str();
}

namespace {

struct Bar {
  std::string label;
  std::vector<double> values;  // one per series
};

// Horizontal grouped bar chart as inline SVG.
std::string svg_bars(const std::string& title, const std::vector<Bar>& bars, const std::vector<std::string>& series,
                     const std::vector<std::string>& colors, int digits, const std::string& unit) {
  const int row_height = 14 * static_cast<int>(series.size()) + 10, label_width = 140, chart_width = 420, top = 28;
  const int height = top + row_height * static_cast<int>(bars.size()) + 24;
  double max_value = 0;
  for (const auto& bar : bars) {
    for (double value : bar.values) max_value = std::max(max_value, value);
  }
  if (max_value <= 0) max_value = 1;
  std::ostringstream svg;
  svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << label_width + chart_width + 90 << "\" height=\""
      << height << "\" role=\"img\" aria-label=\"" << html_escape(title)
      << "\">\n<text x=\"0\" y=\"16\" font-size=\"14\" "
      << "font-weight=\"bold\">" << html_escape(title) << "</text>\n";
  for (size_t i = 0; i < bars.size(); ++i) {
    const int row_y = top + static_cast<int>(i) * row_height;
    svg << "<text x=\"0\" y=\"" << row_y + 12 << "\" font-size=\"12\">" << html_escape(bars[i].label) << "</text>\n";
    for (size_t series_index = 0; series_index < bars[i].values.size(); ++series_index) {
      const bool missing = bars[i].values[series_index] < 0;  // no data: an empty bar labelled n/a
      const double value = std::max(0.0, bars[i].values[series_index]);
      const double bar_width = chart_width * value / max_value;
      const int bar_y = row_y + static_cast<int>(series_index) * 14;
      svg << "<rect x=\"" << label_width << "\" y=\"" << bar_y << "\" width=\"" << fixed_text(bar_width, 1)
          << "\" height=\"12\" fill=\"" << colors[series_index % colors.size()] << "\"><title>"
          << html_escape(series[series_index]) << ": " << (missing ? "n/a" : fixed_text(value, digits) + unit)
          << "</title></rect>\n<text x=\"" << label_width + static_cast<int>(bar_width) + 4 << "\" y=\"" << bar_y + 10
          << "\" font-size=\"11\">" << (missing ? "n/a" : fixed_text(value, digits) + unit) << "</text>\n";
    }
  }
  int legend_x = label_width;
  for (size_t series_index = 0; series_index < series.size() && series.size() > 1; ++series_index) {
    svg << "<rect x=\"" << legend_x << "\" y=\"" << height - 14 << "\" width=\"10\" height=\"10\" fill=\""
        << colors[series_index % colors.size()] << "\"/><text x=\"" << legend_x + 14 << "\" y=\"" << height - 5
        << "\" font-size=\"11\">" << html_escape(series[series_index]) << "</text>\n";
    legend_x += 14 + 8 * static_cast<int>(series[series_index].size()) + 16;
  }
  svg << "</svg>\n";
  return svg.str();
}

// Markdown tables -> HTML tables; the HTML report reuses the markdown text so both stay in step.
std::string markdown_to_html(const std::string& text) {
  std::ostringstream html;
  std::istringstream is(text);
  std::string line;
  bool in_table = false, header = false;
  auto cells = [](const std::string& row) {
    std::vector<std::string> out;
    std::string cur;
    for (size_t i = 1; i < row.size(); ++i) {
      if (row[i] == '\\' && i + 1 < row.size() && row[i + 1] == '|') {
        cur += '|';
        ++i;
      } else if (row[i] == '|') {
        out.push_back(cur.size() >= 2 ? cur.substr(1, cur.size() - 2) : cur);
        cur.clear();
      } else {
        cur += row[i];
      }
    }
    return out;
  };
  auto inline_md = [](const std::string& span) {
    std::string escaped = html_escape(span);
    for (size_t open; (open = escaped.find("**")) != std::string::npos;) {
      const size_t close = escaped.find("**", open + 2);
      if (close == std::string::npos) break;
      escaped = escaped.substr(0, open) + "<b>" + escaped.substr(open + 2, close - open - 2) + "</b>" +
                escaped.substr(close + 2);
    }
    return escaped;
  };
  std::vector<std::string> lines;
  while (std::getline(is, line)) lines.push_back(line);
  auto separator = [](const std::string& row) { return row.rfind("|--", 0) == 0 || row.rfind("|:-", 0) == 0; };
  std::vector<bool> right;  // per column: `---:` in the separator row
  for (size_t index = 0; index < lines.size(); ++index) {
    line = lines[index];
    if (!line.empty() && line[0] == '|') {
      if (separator(line)) continue;
      if (!in_table) {
        html << "<table>\n";
        in_table = header = true;
        right.clear();
        if (index + 1 < lines.size() && separator(lines[index + 1])) {
          // "|---|---:|": a column whose dashes end in ':' is right-aligned
          const std::string& marks = lines[index + 1];
          for (size_t bar = marks.find('|'); bar + 1 < marks.size(); bar = marks.find('|', bar + 1)) {
            const size_t next = marks.find('|', bar + 1);
            if (next == std::string::npos) break;
            right.push_back(next > bar + 1 && marks[next - 1] == ':');
          }
        }
      }
      html << "<tr>";
      const auto row = cells(line);
      for (size_t column = 0; column < row.size(); ++column) {
        const char* tag = header ? "th" : "td";
        const bool number = column < right.size() && right[column];
        html << "<" << tag << (number ? " class=\"n\"" : "") << ">" << inline_md(row[column]) << "</" << tag << ">";
      }
      html << "</tr>\n";
      header = false;
      continue;
    }
    if (in_table) {
      html << "</table>\n";
      in_table = false;
    }
    if (line.rfind("## ", 0) == 0) {
      html << "<h2>" << inline_md(line.substr(3)) << "</h2>\n";
    } else if (line.rfind("# ", 0) == 0) {
      html << "<h1>" << inline_md(line.substr(2)) << "</h1>\n";
    } else if (!line.empty()) {
      html << "<p>" << inline_md(line) << "</p>\n";
    }
  }
  if (in_table) html << "</table>\n";
  return html.str();
}

}  // namespace

std::string report_html(const MonthlyReport& report) {
  std::vector<Bar> hours, eff, waste;
  for (const auto& team : report.teams) {
    hours.push_back({team.team, {team.prev_gpu_hours, team.gpu_hours}});
    eff.push_back(
        {team.team,
         {team.prev_avg_util < 0 ? -1 : 100 * team.prev_avg_util, team.avg_util < 0 ? -1 : 100 * team.avg_util}});
  }
  for (const auto& waste_row : report.waste) {
    waste.push_back({waste_row.user + " (" + waste_row.team + ")", {waste_row.wasted_gpu_hours}});
  }
  const std::vector<std::string> months = {report.prev_month, report.month};
  const std::vector<std::string> colors = {"#a9b4c4", "#3b7dd8"};
  std::ostringstream charts;
  charts << "<div class=\"charts\">\n"
         << svg_bars("GPU-hours per team", hours, months, colors, 1, "")
         << svg_bars("GPU utilisation per team", eff, months, colors, 0, " %");
  if (!waste.empty()) {
    charts << svg_bars("Idle GPU-hours (waste leaderboard)", waste, {report.month}, {"#d8453b"}, 1, "");
  }
  charts << "</div>\n";

  std::string body = markdown_to_html(report_markdown(report));
  // charts go right after the summary line
  const size_t at = body.find("<h2>");
  body.insert(at == std::string::npos ? body.size() : at, charts.str());
  std::ostringstream html;
  html << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>GPU usage journal "
       << html_escape(report.month)
       << "</title>\n<style>body{font-family:system-ui,sans-serif;margin:24px;color:#1d2330}"
          "table{border-collapse:collapse;margin:8px 0 16px}th,td{border:1px solid #dde1e7;padding:4px 10px;"
          "text-align:left;font-size:13px}th{background:#eef1f5}"
          "th.n,td.n{text-align:right;font-variant-numeric:tabular-nums}.charts svg{display:block;margin:12px 0}"
          "svg text{font-family:system-ui,sans-serif}</style></head><body>\n"
       << body << "</body></html>\n";
  return html.str();
}

namespace {

// RFC 4180: a field with a comma, a quote or a line break is quoted, its quotes doubled.
std::string csv_field(const std::string& text) {
  if (text.find_first_of(",\"\r\n") == std::string::npos) return text;
  std::string out = "\"";
  for (char character : text) {
    if (character == '"') out += '"';
    out += character;
  }
  return out + "\"";
}

constexpr const char* kCsvColumns[] = {"record",
                                       "month",
                                       "team",
                                       "user",
                                       "lease",
                                       "job",
                                       "model",
                                       "gpus",
                                       "gpu_hours",
                                       "prev_gpu_hours",
                                       "leases",
                                       "gpu_utilization",
                                       "idle_gpu_hours",
                                       "duration_s",
                                       "outcome",
                                       "used_gpu_hours",
                                       "allowance_gpu_hours",
                                       "balance_gpu_hours",
                                       "time_utc",
                                       "justification",
                                       "review",
                                       "note",
                                       "kind",
                                       "subject",
                                       "suggestion",
                                       "evidence",
                                       "gpu_hours_suggested"};

class CsvWriter {
 public:
  CsvWriter() {
    for (const char* column : kCsvColumns) header_.push_back(column);
    for (size_t i = 0; i < header_.size(); ++i) out_ << (i ? "," : "") << header_[i];
    out_ << "\r\n";
  }
  // One row: the named fields, every other column empty.
  void row(const std::map<std::string, std::string>& fields) {
    for (const auto& [name, value] : fields) {
      if (std::find(header_.begin(), header_.end(), name) == header_.end()) {
        throw std::logic_error("report_csv: no column " + name);
      }
    }
    for (size_t i = 0; i < header_.size(); ++i) {
      auto it = fields.find(header_[i]);
      out_ << (i ? "," : "") << (it == fields.end() ? "" : csv_field(it->second));
    }
    out_ << "\r\n";
  }
  std::string text() const { return out_.str(); }

 private:
  std::vector<std::string> header_;
  std::ostringstream out_;
};

std::string utilization(double value) { return value < 0 ? "" : fixed_text(value, 4); }

}  // namespace

std::string report_csv(const MonthlyReport& report) {
  constexpr int kDigits = 3;
  const ShownHours shown = shown_hours(report, kDigits);
  CsvWriter csv;
  csv.row({{"record", "report"},
           {"month", report.month},
           {"time_utc", utc_minutes(report.generated_ms)},
           {"note", report.month_in_progress() ? "month in progress: figures up to time_utc" : "month complete"}});
  for (size_t i = 0; i < report.teams.size(); ++i) {
    const ReportTeam& team = report.teams[i];
    csv.row({{"record", "team"},
             {"month", report.month},
             {"team", team.team},
             {"gpu_hours", fixed_text(shown.current[i], kDigits)},
             {"prev_gpu_hours", fixed_text(shown.previous[i], kDigits)},
             {"leases", std::to_string(team.leases)},
             {"gpu_utilization", utilization(team.avg_util)},
             {"idle_gpu_hours", fixed_text(shown.idle[i], kDigits)}});
  }
  csv.row({{"record", "total"},
           {"month", report.month},
           {"gpu_hours", fixed_text(shown.total, kDigits)},
           {"prev_gpu_hours", fixed_text(shown.prev_total, kDigits)},
           {"leases", std::to_string(shown.leases)},
           {"idle_gpu_hours", fixed_text(shown.idle_total, kDigits)}});
  for (const auto& job : report.top_jobs) {
    csv.row({{"record", "job"},
             {"month", report.month},
             {"team", job.team},
             {"user", job.user},
             {"lease", std::to_string(job.lease_id)},
             {"job", job.job},
             {"model", job.model},
             {"gpus", gpus_text(job.gpus)},
             {"gpu_hours", fixed_text(job.gpu_hours, kDigits)},
             {"gpu_utilization", utilization(job.avg_util)},
             {"duration_s", std::to_string(job.duration_ms / 1000)},
             {"outcome", lease_outcome(job.state, job.outcome)}});
  }
  for (const auto& waste_row : report.waste) {
    csv.row({{"record", "waste"},
             {"month", report.month},
             {"team", waste_row.team},
             {"user", waste_row.user},
             {"leases", std::to_string(waste_row.leases)},
             {"idle_gpu_hours", fixed_text(waste_row.wasted_gpu_hours, kDigits)},
             {"duration_s", std::to_string(waste_row.longest_low_ms / 1000)}});
  }
  for (const auto& credit : report.credits) {
    std::map<std::string, std::string> fields = {{"record", "credit"},
                                                 {"month", report.month},
                                                 {"team", credit.team},
                                                 {"user", credit.user},
                                                 {"used_gpu_hours", fixed_text(credit.used, kDigits)}};
    if (credit.allowance >= 0) {
      fields["allowance_gpu_hours"] = fixed_text(credit.allowance, kDigits);
      fields["balance_gpu_hours"] = fixed_text(credit.balance(), kDigits);
    }
    csv.row(fields);
  }
  const JournalAdvice advice = advise(report);
  for (const Suggestion& s : advice.suggestions) {
    std::map<std::string, std::string> fields = {{"record", "suggestion"},          {"month", report.month},
                                                 {"kind", suggestion_kind(s.kind)}, {"subject", s.subject},
                                                 {"suggestion", s.advice},          {"evidence", s.evidence}};
    if (s.kind == SuggestionKind::kUnderusedJob) {
      fields["gpu_hours"] = fixed_text(s.gpu_hours, kDigits);
      fields["gpu_hours_suggested"] = fixed_text(s.gpu_hours_after, kDigits);
    }
    csv.row(fields);
  }
  for (const TypicalCase& c : advice.typical_cases) {
    for (const auto& [which, job] : {std::pair<const char*, const ReportJob*>{"most efficient", &c.most_efficient},
                                     {"least efficient", &c.least_efficient}}) {
      if (c.runs == 1 && std::string(which) == "least efficient") continue;
      csv.row({{"record", "typical"},
               {"month", report.month},
               {"model", c.model},
               {"kind", which},
               {"lease", std::to_string(job->lease_id)},
               {"job", job->job},
               {"user", job->user},
               {"team", job->team},
               {"gpus", gpus_text(job->gpus)},
               {"gpu_hours", fixed_text(job->gpu_hours, kDigits)},
               {"gpu_utilization", utilization(job->avg_util)}});
    }
  }
  for (const auto& emergency : report.emergencies) {
    csv.row({{"record", "emergency"},
             {"month", report.month},
             {"team", emergency.team},
             {"user", emergency.user},
             {"lease", std::to_string(emergency.lease_id)},
             {"job", emergency.job},
             {"gpus", gpus_text(emergency.gpus)},
             {"gpu_hours", fixed_text(emergency.gpu_hours, kDigits)},
             {"time_utc", utc_minutes(emergency.granted_ms)},
             {"justification", emergency.justification},
             {"review", emergency.review}});
  }
  return csv.text();
}

}  // namespace yolo8::quota
