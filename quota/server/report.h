#pragma once
// `quotad report`: the monthly usage journal per team, read straight from quotad's SQLite store.
#include <cstdint>
#include <string>
#include <vector>

#include "quota/core/engine.h"
#include "quota/core/policy.h"

namespace yolo8::quota {

struct ReportTeam {
  std::string team;
  double gpu_hours = 0, prev_gpu_hours = 0;
  int leases = 0;
  double avg_util = -1, prev_avg_util = -1;  // GPU-weighted mean of the month's heartbeat samples; -1: none
  double wasted_gpu_hours = 0;
};

struct ReportJob {
  int64_t lease_id = 0;
  std::string team, user, job, model;
  LeaseState state = LeaseState::kGranted;
  Outcome outcome = Outcome::kNone;  // none while it runs, or when it expired without a release
  double gpus = 0;
  double gpu_hours = 0;  // within the month
  int64_t duration_ms = 0;
  double avg_util = -1;
};

struct ReportWaste {
  std::string user, team;
  double wasted_gpu_hours = 0;  // GPUs x time in low-utilisation runs at least the policy's duration long
  int leases = 0;
  int64_t longest_low_ms = 0;
};

struct ReportCredit {
  std::string user, team;
  double used = 0;
  double allowance = -1;  // -1: unknown (no policy given) or credits disabled
  double balance() const { return allowance < 0 ? 0 : allowance - used; }
};

struct ReportEmergency {
  int64_t lease_id = 0;
  std::string team, user, job, justification, review;  // review: "pending" or the reviewer's note
  int64_t granted_ms = 0;
  double gpus = 0;
  double gpu_hours = 0;
};

struct MonthlyReport {
  std::string month, prev_month;
  double waste_util_below = 0.20;
  int waste_after_s = 3600;
  std::vector<ReportTeam> teams;    // by GPU-hours, most first
  std::vector<ReportJob> top_jobs;  // by GPU-hours in the month, at most `top_n`
  std::vector<ReportWaste> waste;   // leaderboard per user, most wasted first
  std::vector<ReportCredit> credits;
  std::vector<ReportEmergency> emergencies;
  double total_gpu_hours = 0, prev_total_gpu_hours = 0;
};

// Reads `db_path` read-only. `month` is "YYYY-MM" (throws std::invalid_argument otherwise); `policy` (may be
// null) gives team membership, credit allowances and the waste thresholds (defaults: 20 %, 1 h).
// GPU-hours are lease time inside the month times the GPUs (or memory share) of each lease.
MonthlyReport build_report(const std::string& db_path, const std::string& month, const Policy* policy, int top_n = 10);

std::string report_markdown(const MonthlyReport& report);
// Standalone HTML with inline SVG bar charts (no scripts, no external assets).
std::string report_html(const MonthlyReport& report);

// [start, end) of a "YYYY-MM" month in UTC milliseconds; throws std::invalid_argument.
void month_range_ms(const std::string& month, int64_t& start_ms, int64_t& end_ms);

}  // namespace yolo8::quota
