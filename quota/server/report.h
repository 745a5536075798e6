#pragma once
// `quotad report`: the monthly usage journal per team, read straight from quotad's SQLite store.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "quota/core/calendar.h"
#include "quota/core/engine.h"
#include "quota/core/policy.h"
#include "quota/core/recommend.h"
#include "quota/store/state_store.h"

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
  // What the journal's advice weighs (journal_advice.h): the lease's GPUs, their memory (per GPU: a whole GPU's,
  // or the share), and what the trainer last reported (-1: not reported).
  int whole_gpus = 0;
  bool shared = false;
  bool may_share = false;  // the policy lets this model hold a one-GPU shared lease
  double memory_gib = 0;
  double peak_memory_gib = -1;
  double process_memory_gib = -1;  // NVML: the trainer's process on its GPU, the CUDA context included
  double device_memory_gib = -1;   // NVML: every process's on that GPU (on a shared GPU, every lease's)
  int batch = -1, imgsz = -1;
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
  double prev_used = 0;   // the month before
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
  int64_t generated_ms = 0;  // when the report was built (UTC ms)
  int64_t month_start_ms = 0;
  int64_t month_end_ms = 0;  // start of the next month
  bool month_in_progress() const { return generated_ms < month_end_ms; }
  // The share of the month gone at generation time (1 once it is over).
  double elapsed_share() const {
    if (month_end_ms <= month_start_ms || !month_in_progress()) return 1;
    return std::clamp(
        static_cast<double>(generated_ms - month_start_ms) / static_cast<double>(month_end_ms - month_start_ms), 0.0,
        1.0);
  }
  double waste_util_below = 0.20;
  int waste_after_s = 3600;
  std::vector<ReportTeam> teams;    // by GPU-hours, most first
  std::vector<ReportJob> top_jobs;  // by GPU-hours in the month, at most `top_n`
  std::vector<ReportJob> jobs;      // every job of the month, by GPU-hours (the advice reads them all)
  std::vector<ReportWaste> waste;   // leaderboard per user, most wasted first
  std::vector<ReportCredit> credits;
  std::vector<ReportEmergency> emergencies;
  double total_gpu_hours = 0, prev_total_gpu_hours = 0;
  // From the policy, for the advice: the GPU sizes of the inventory and `quotad recommend` over this month
  // (empty without a policy).
  std::vector<double> gpu_memory_sizes;  // distinct, smallest first
  std::vector<TeamRecommendation> recommended;
};

// Reads the database `db` names (a `--db`: a SQLite file or a PostgreSQL URL, parse_db_target) read-only.
// `month` is "YYYY-MM" (throws std::invalid_argument otherwise); `policy` (may be null) gives team membership,
// credit allowances and the waste thresholds (defaults: 20 %, 1 h). GPU-hours are lease time inside the month
// times the GPUs (or memory share) of each lease. `now_ms` (0: the system clock) is the "generated at" time; a
// month that is not over is marked in progress.
MonthlyReport build_report(const std::string& db, const std::string& month, const Policy* policy, int top_n = 10,
                           int64_t now_ms = 0);
// The same through a reader already open (open_report_reader: a PostgreSQL password from a file).
MonthlyReport build_report(ReportReader& reader, const std::string& month, const Policy* policy, int top_n = 10,
                           int64_t now_ms = 0);

// The journal, with its advice (journal_advice.h): suggestions with their evidence, the biggest savings, and the
// month's typical cases per model.
std::string report_markdown(const MonthlyReport& report);
// Standalone HTML with inline SVG bar charts (no scripts, no external assets); numbers right-aligned.
std::string report_html(const MonthlyReport& report);
// One RFC 4180 table: a `record` column (report, team, total, job, waste, credit, suggestion, typical, emergency)
// and the columns each record uses; GPU-hours with 3 decimals, team rows summing exactly to the total row.
std::string report_csv(const MonthlyReport& report);

// What happened to a lease, for every lease: running, revoking, completed, preempted, failed, cancelled,
// revoked (its preemption deadline passed), expired (no heartbeat), released, rejected, queued, ...
std::string lease_outcome(LeaseState state, Outcome outcome);

// `values` rounded to `digits` decimals so that the rounded figures add up to the rounded sum (largest
// remainder): a table's rows then add up to the total it shows.
std::vector<double> round_to_total(const std::vector<double>& values, int digits);

// [start, end) of a "YYYY-MM" month in UTC milliseconds; throws std::invalid_argument.
void month_range_ms(const std::string& month, int64_t& start_ms, int64_t& end_ms);

}  // namespace yolo8::quota
