#pragma once
// The monthly journal's advice: suggestions, each with the month's figures behind it, the biggest
// savings among them, and the month's typical cases per model. Pure: computed from a built MonthlyReport alone.
#include <string>
#include <vector>

#include "quota/server/report.h"

namespace yolo8::quota {

enum class SuggestionKind { kUnderusedJob, kQuota, kCredit };

struct Suggestion {
  SuggestionKind kind = SuggestionKind::kUnderusedJob;
  std::string subject;   // "lease 4 idle-notebook (bob, team-cv)", "team-cv", "alice (team-cv)"
  std::string advice;    // what to change, in the request's or the policy's own terms
  std::string evidence;  // the month's figures the advice rests on
  // Underused jobs: GPU-hours charged this month and what the advice would have charged (equal: no saving).
  double gpu_hours = 0, gpu_hours_after = 0;
  double saving() const { return gpu_hours - gpu_hours_after; }
};

// The most and the least efficient run of one model this month (by mean GPU utilisation; among equals, the first
// granted).
struct TypicalCase {
  std::string model;
  int runs = 0;  // runs of the model with utilisation samples
  ReportJob most_efficient, least_efficient;
};

struct JournalAdvice {
  std::vector<Suggestion> suggestions;     // underused jobs (largest saving first), then quotas, then credits
  std::vector<Suggestion> savings;         // the underused jobs with a saving, largest first, at most kTopSavings
  std::vector<TypicalCase> typical_cases;  // by model name
};

inline constexpr size_t kTopSavings = 3;
// A suggested GPU count leaves this much headroom: a job at 40 % on 4 GPUs is advised 2 (80 % each), not 1.6.
inline constexpr double kTargetUtilisation = 0.8;
// A shared lease asks for the reported peak plus this margin.
inline constexpr double kSharedMemoryMargin = 1.25;
// Members at or above this share of their credit, or on course to exceed it, get a suggestion.
inline constexpr double kCreditWarningShare = 0.8;

// Rules, in order, for a job below the report's waste threshold for at least its waste duration:
//  1. a whole single GPU whose reported peak (x kSharedMemoryMargin) fits in half of it, for a model the policy
//     lets share: a shared lease of that memory (charged memory / GPU memory of a GPU-hour);
//  2. several GPUs: the fewest that keep the same work at kTargetUtilisation (charged proportionally);
//  3. a peak that fits a smaller GPU of the inventory: that GPU (no GPU-hours saved, the large card freed);
//  4. otherwise: the GPU waited for its input (the loader, a cache, or a smaller model), no figure to promise.
// Quotas: every team whose recommended base or burst (quotad recommend, over the month) differs from the policy.
// Credits: members with an allowance who used kCreditWarningShare of it, or whose pace (used / the month's elapsed
// share, for a month in progress) passes it; with last month's use for the trend.
JournalAdvice advise(const MonthlyReport& report);

// GPU counts as a person writes them: "2", "0.25" (at most two decimals, no trailing zeros).
std::string gpus_text(double gpus);

}  // namespace yolo8::quota
