#include "quota/server/journal_advice.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "quota/core/api.h"
#include "quota/server/status_page.h"

namespace yolo8::quota {

namespace {

std::string percent_text(double share) { return fixed_text(100 * share, 0) + " %"; }

std::string hours_text(double hours) { return fixed_text(hours, 1) + " GPU-h"; }

std::string job_subject(const ReportJob& job) {
  return "lease " + std::to_string(job.lease_id) + " " + job.job + " (" + job.user + ", " + job.team + ")";
}

// What the job used, as its figures: "yolov8x, 2 GPUs for 8h 0m at 10 % utilisation, 16.0 GPU-h; peak 12 GiB of
// 80 GiB per GPU; batch 16 at 640 px".
std::string job_evidence(const ReportJob& job) {
  std::string text = job.model + ", " + gpus_text(job.gpus) + (job.gpus == 1 ? " GPU" : " GPUs") + " for " +
                     format_duration_ms(job.duration_ms) + " at " + percent_text(job.avg_util) + " utilisation, " +
                     hours_text(job.gpu_hours);
  if (job.peak_memory_gib > 0) {
    text += "; peak " + fixed_text(job.peak_memory_gib, 1) + " GiB of " + fixed_text(job.memory_gib, 0) + " GiB" +
            (job.shared ? " shared" : " per GPU");
  }
  if (const std::string on_gpu = device_memory_text(job.process_memory_gib, job.device_memory_gib); !on_gpu.empty()) {
    text += "; on the GPU " + on_gpu;
  }
  if (job.batch > 0) text += "; batch " + std::to_string(job.batch) + " per GPU";
  if (job.imgsz > 0) text += " at " + std::to_string(job.imgsz) + " px";
  return text;
}

// The first rule of advise()'s list that applies to an underused job.
Suggestion underused_job(const ReportJob& job, const MonthlyReport& report) {
  Suggestion s;
  s.kind = SuggestionKind::kUnderusedJob;
  s.subject = job_subject(job);
  s.evidence = job_evidence(job);
  s.gpu_hours = s.gpu_hours_after = job.gpu_hours;
  const bool whole = !job.shared && job.whole_gpus > 0;
  const double peak = job.peak_memory_gib;
  const double needed = std::ceil(peak * kSharedMemoryMargin);
  if (whole && job.whole_gpus == 1 && job.may_share && peak > 0 && needed <= job.memory_gib / 2) {
    s.advice = "a shared lease (shared=true, memory_gib=" + fixed_text(needed, 0) + ") would have held it: charged " +
               fixed_text(needed, 0) + "/" + fixed_text(job.memory_gib, 0) + " of a GPU, and the rest of the card " +
               "free for others";
    s.gpu_hours_after = job.gpu_hours * needed / job.memory_gib;
    return s;
  }
  if (whole && job.whole_gpus >= 2) {
    const int fewer = std::max(1, static_cast<int>(std::ceil(job.whole_gpus * job.avg_util / kTargetUtilisation)));
    if (fewer < job.whole_gpus) {
      s.advice = "gpus=" + std::to_string(fewer) + ": the same work keeps " + std::to_string(fewer) +
                 (fewer == 1 ? " GPU" : " GPUs") + " " + percent_text(job.whole_gpus * job.avg_util / fewer) + " busy";
      s.gpu_hours_after = job.gpu_hours * fewer / job.whole_gpus;
      return s;
    }
  }
  if (whole && peak > 0) {
    for (double size : report.gpu_memory_sizes) {
      if (size < job.memory_gib && peak * kSharedMemoryMargin <= size) {
        s.advice = "a " + fixed_text(size, 0) + " GiB GPU would have held its " + fixed_text(peak, 1) +
                   " GiB peak (memory_gib=" + fixed_text(needed, 0) + "), leaving the " +
                   fixed_text(job.memory_gib, 0) + " GiB card to jobs that need it";
        return s;
      }
    }
  }
  s.advice =
      "the GPU waited for its input most of the time: more loader workers (workers=), cache=ram, or a "
      "smaller model than " +
      job.model + " if its accuracy suffices";
  return s;
}

Suggestion quota_change(const TeamRecommendation& team) {
  Suggestion s;
  s.kind = SuggestionKind::kQuota;
  s.subject = team.team;
  s.advice = "base " + gpus_text(team.current_base) + " -> " + gpus_text(team.base) + ", burst " +
             gpus_text(team.current_burst) + " -> " + gpus_text(team.burst) +
             " (`quotad recommend` writes the policy change)";
  s.evidence = "held " + gpus_text(team.p50_in_use) + " GPUs at the median and " + gpus_text(team.p95_in_use) +
               " at p95 while active (" + percent_text(team.active_share) + " of the month), " +
               gpus_text(team.p95_demand) + " wanted at p95 with the queue, waits p95 " +
               format_duration_ms(static_cast<int64_t>(team.p95_wait_s * 1000)) + ", idle " +
               percent_text(team.idle_share) + " of sampled time; " + hours_text(team.gpu_hours) + " held";
  return s;
}

}  // namespace

std::string gpus_text(double gpus) {
  std::string text = fixed_text(gpus, 2);
  if (text.find('.') != std::string::npos) {
    while (text.back() == '0') text.pop_back();
    if (text.back() == '.') text.pop_back();
  }
  return text == "-0" ? "0" : text;
}

JournalAdvice advise(const MonthlyReport& report) {
  JournalAdvice advice;
  const int64_t low_for_ms = static_cast<int64_t>(report.waste_after_s) * 1000;
  std::vector<Suggestion> jobs;
  for (const ReportJob& job : report.jobs) {
    if (job.avg_util < 0 || job.avg_util >= report.waste_util_below || job.duration_ms < low_for_ms) continue;
    jobs.push_back(underused_job(job, report));
  }
  std::stable_sort(jobs.begin(), jobs.end(),
                   [](const Suggestion& left, const Suggestion& right) { return left.saving() > right.saving(); });
  for (const Suggestion& s : jobs) {
    if (s.saving() > 0 && advice.savings.size() < kTopSavings) advice.savings.push_back(s);
  }
  advice.suggestions = std::move(jobs);

  for (const TeamRecommendation& team : report.recommended) {
    if (team.has_history && (team.base != team.current_base || team.burst != team.current_burst)) {
      advice.suggestions.push_back(quota_change(team));
    }
  }

  for (const ReportCredit& credit : report.credits) {
    if (credit.allowance <= 0) continue;
    const double share = credit.used / credit.allowance;
    // a month in progress: the use so far over the share of the month gone
    const double pace =
        report.month_in_progress() && report.elapsed_share() > 0 ? credit.used / report.elapsed_share() : credit.used;
    if (share < kCreditWarningShare && pace <= credit.allowance) continue;
    Suggestion s;
    s.kind = SuggestionKind::kCredit;
    s.subject = credit.user + " (" + credit.team + ")";
    std::string trend = credit.prev_used > 0 ? (credit.used >= credit.prev_used ? "up from " : "down from ") +
                                                   hours_text(credit.prev_used) + " last month"
                                             : "nothing last month";
    s.evidence = hours_text(credit.used) + " of " + hours_text(credit.allowance) + " used (" + percent_text(share) +
                 "), " + trend;
    if (report.month_in_progress()) {
      s.evidence += "; at this pace " + hours_text(pace) + " by the month's end";
    }
    s.advice = share >= 1 ? "over the credit: further leases are refused until next month, or a lead approves a loan "
                            "(POST /v1/loans)"
               : pace > credit.allowance
                   ? "on course to exceed the credit before the month ends: plan the remaining runs, or ask a lead "
                     "for a loan in time"
                   : "close to the credit: " + hours_text(credit.balance()) + " left this month";
    advice.suggestions.push_back(s);
  }

  std::map<std::string, TypicalCase> cases;
  for (const ReportJob& job : report.jobs) {
    if (job.avg_util < 0) continue;
    TypicalCase& c = cases[job.model];
    if (c.runs == 0 || job.avg_util > c.most_efficient.avg_util) c.most_efficient = job;
    if (c.runs == 0 || job.avg_util < c.least_efficient.avg_util) c.least_efficient = job;
    c.model = job.model;
    ++c.runs;
  }
  for (auto& [model, c] : cases) advice.typical_cases.push_back(c);
  return advice;
}

}  // namespace yolo8::quota
