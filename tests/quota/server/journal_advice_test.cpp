// The journal's advice: each rule on a hand-made month, then a scripted month in a real quotad database
// whose journal names the wasteful job, the team over its base and the member near the credit with their figures.
#include "quota/server/journal_advice.h"

#include <gtest/gtest.h>

#include <string>

#include "tests/quota/visibility_util.h"

namespace yolo8::quota {
namespace {

using testing::kHour;
using testing::kMinute;

ReportJob job(int64_t id, const std::string& model, int gpus, double hours, double util, double memory_gib,
              double peak_gib) {
  ReportJob j;
  j.lease_id = id;
  j.team = "team-cv";
  j.user = "alice";
  j.job = "run-" + std::to_string(id);
  j.model = model;
  j.gpus = gpus;
  j.whole_gpus = gpus;
  j.gpu_hours = gpus * hours;
  j.duration_ms = static_cast<int64_t>(hours * static_cast<double>(kHour));
  j.avg_util = util;
  j.memory_gib = memory_gib;
  j.peak_memory_gib = peak_gib;
  j.may_share = model == "yolov8n" || model == "yolov8s";
  return j;
}

MonthlyReport month_with(std::vector<ReportJob> jobs) {
  MonthlyReport r;
  r.month = "2026-11";
  month_range_ms(r.month, r.month_start_ms, r.month_end_ms);
  r.generated_ms = r.month_end_ms + kHour;
  r.gpu_memory_sizes = {24, 80};
  r.jobs = std::move(jobs);
  return r;
}

TEST(JournalAdvice, AnIdleSmallModelOnAWholeGpuIsToldTheSharedLeaseThatFits) {
  const JournalAdvice a = advise(month_with({job(7, "yolov8s", 1, 8, 0.10, 80, 12)}));
  ASSERT_EQ(a.suggestions.size(), 1u);
  const Suggestion& s = a.suggestions[0];
  EXPECT_EQ(s.kind, SuggestionKind::kUnderusedJob);
  EXPECT_EQ(s.subject, "lease 7 run-7 (alice, team-cv)");
  EXPECT_NE(s.advice.find("shared=true, memory_gib=15"), std::string::npos) << s.advice;  // ceil(12 x 1.25)
  EXPECT_NE(s.evidence.find("10 % utilisation, 8.0 GPU-h"), std::string::npos) << s.evidence;
  EXPECT_NE(s.evidence.find("peak 12.0 GiB of 80 GiB per GPU"), std::string::npos) << s.evidence;
  EXPECT_DOUBLE_EQ(s.gpu_hours, 8);
  EXPECT_DOUBLE_EQ(s.gpu_hours_after, 8 * 15.0 / 80);
  ASSERT_EQ(a.savings.size(), 1u);
}

// On a shared GPU the device's memory is every lease's: the evidence names the process's own figure where the
// trainer reported it, and says nothing of the GPU where it reported neither.
TEST(JournalAdvice, TheEvidenceNamesTheProcesssOwnMemoryOnItsGpu) {
  ReportJob shared = job(8, "yolov8n", 1, 8, 0.10, 10, 6);
  shared.shared = true;
  shared.process_memory_gib = 6.9;
  shared.device_memory_gib = 20.4;
  const JournalAdvice a = advise(month_with({shared}));
  ASSERT_EQ(a.suggestions.size(), 1u);
  EXPECT_NE(a.suggestions[0].evidence.find("peak 6.0 GiB of 10 GiB shared; on the GPU process 6.9 GiB of device "
                                           "20.4 GiB"),
            std::string::npos)
      << a.suggestions[0].evidence;
  const JournalAdvice unsaid = advise(month_with({job(9, "yolov8n", 1, 8, 0.10, 10, 6)}));
  ASSERT_EQ(unsaid.suggestions.size(), 1u);
  EXPECT_EQ(unsaid.suggestions[0].evidence.find("on the GPU"), std::string::npos) << unsaid.suggestions[0].evidence;
}

TEST(JournalAdvice, AnIdleMultiGpuJobIsToldTheFewestGpusThatKeepItsWork) {
  // 4 GPUs at 15 %: 0.6 GPUs of work, one GPU at 60 %
  const JournalAdvice a = advise(month_with({job(3, "yolov8m", 4, 5, 0.15, 80, 30)}));
  ASSERT_EQ(a.suggestions.size(), 1u);
  EXPECT_NE(a.suggestions[0].advice.find("gpus=1:"), std::string::npos) << a.suggestions[0].advice;
  EXPECT_NE(a.suggestions[0].advice.find("60 % busy"), std::string::npos) << a.suggestions[0].advice;
  EXPECT_DOUBLE_EQ(a.suggestions[0].gpu_hours_after, 5);
  // 8 GPUs at 19 %: 1.52 GPUs of work, at 80 % that is 2 GPUs
  const JournalAdvice b = advise(month_with({job(4, "yolov8l", 8, 2, 0.19, 80, 40)}));
  EXPECT_NE(b.suggestions.at(0).advice.find("gpus=2:"), std::string::npos) << b.suggestions[0].advice;
}

TEST(JournalAdvice, ALargeModelWithASmallPeakIsToldTheSmallerGpu) {
  const JournalAdvice a = advise(month_with({job(5, "yolov8x", 1, 8, 0.10, 80, 14)}));  // x may not share
  ASSERT_EQ(a.suggestions.size(), 1u);
  EXPECT_NE(a.suggestions[0].advice.find("a 24 GiB GPU would have held its 14.0 GiB peak"), std::string::npos)
      << a.suggestions[0].advice;
  EXPECT_DOUBLE_EQ(a.suggestions[0].saving(), 0);
  EXPECT_TRUE(a.savings.empty());
}

TEST(JournalAdvice, OtherwiseTheInputIsSuspectedAndNoSavingPromised) {
  const JournalAdvice a = advise(month_with({job(6, "yolov8x", 1, 8, 0.10, 80, 70)}));
  ASSERT_EQ(a.suggestions.size(), 1u);
  EXPECT_NE(a.suggestions[0].advice.find("workers="), std::string::npos);
  EXPECT_NE(a.suggestions[0].advice.find("smaller model than yolov8x"), std::string::npos);
  EXPECT_DOUBLE_EQ(a.suggestions[0].saving(), 0);
}

TEST(JournalAdvice, BusyOrShortJobsGetNoSuggestion) {
  MonthlyReport r = month_with({job(1, "yolov8s", 1, 8, 0.20, 80, 12),    // at the threshold: not below it
                                job(2, "yolov8s", 1, 0.5, 0.05, 80, 12),  // idle, but under the waste duration
                                job(3, "yolov8s", 1, 8, -1, 80, 12)});    // no utilisation reported
  EXPECT_TRUE(advise(r).suggestions.empty());
}

TEST(JournalAdvice, TheBiggestSavingsComeFirstAndAtMostThree) {
  MonthlyReport r = month_with({job(1, "yolov8s", 1, 2, 0.1, 80, 12), job(2, "yolov8m", 8, 10, 0.1, 80, 30),
                                job(3, "yolov8m", 4, 3, 0.1, 80, 30), job(4, "yolov8s", 1, 20, 0.1, 80, 4),
                                job(5, "yolov8x", 1, 50, 0.1, 80, 70)});
  const JournalAdvice a = advise(r);
  ASSERT_EQ(a.savings.size(), 3u);
  EXPECT_EQ(a.savings[0].subject.rfind("lease 2 ", 0), 0u);  // 80 GPU-h -> 10
  EXPECT_EQ(a.savings[1].subject.rfind("lease 4 ", 0), 0u);  // 20 -> 20 x 5/80
  EXPECT_EQ(a.savings[2].subject.rfind("lease 3 ", 0), 0u);  // 12 -> 3
  for (size_t i = 1; i < a.savings.size(); ++i) EXPECT_GE(a.savings[i - 1].saving(), a.savings[i].saving());
  EXPECT_EQ(a.suggestions.size(), 5u);  // the yolov8x job is advised but saves nothing it could promise
}

TEST(JournalAdvice, ATeamWhoseRecommendedQuotaDiffersIsNamedWithItsFigures) {
  MonthlyReport r = month_with({});
  TeamRecommendation same;
  same.team = "team-robotics";
  same.has_history = true;
  same.current_base = same.base = 6;
  same.current_burst = same.burst = 6;
  TeamRecommendation more = same;
  more.team = "team-cv";
  more.current_base = 8;
  more.current_burst = 14;
  more.base = 10;
  more.burst = 14;
  more.p50_in_use = 10;
  more.p95_in_use = 12;
  more.active_share = 0.25;
  more.gpu_hours = 180;
  r.recommended = {same, more};
  const JournalAdvice a = advise(r);
  ASSERT_EQ(a.suggestions.size(), 1u);
  EXPECT_EQ(a.suggestions[0].kind, SuggestionKind::kQuota);
  EXPECT_EQ(a.suggestions[0].subject, "team-cv");
  EXPECT_NE(a.suggestions[0].advice.find("base 8 -> 10, burst 14 -> 14"), std::string::npos);
  EXPECT_NE(a.suggestions[0].evidence.find("held 10 GPUs at the median and 12 at p95 while active (25 %"),
            std::string::npos)
      << a.suggestions[0].evidence;
}

TEST(JournalAdvice, MembersNearTheirCreditOrOnCourseToPassItAreNamed) {
  MonthlyReport r = month_with({});
  ReportCredit near{"erin", "team-robotics", 90, 40, 100};
  ReportCredit fine{"bob", "team-cv", 50, 60, 100};
  r.credits = {near, fine};
  JournalAdvice a = advise(r);
  ASSERT_EQ(a.suggestions.size(), 1u);
  EXPECT_EQ(a.suggestions[0].subject, "erin (team-robotics)");
  EXPECT_EQ(a.suggestions[0].evidence, "90.0 GPU-h of 100.0 GPU-h used (90 %), up from 40.0 GPU-h last month");
  EXPECT_NE(a.suggestions[0].advice.find("10.0 GPU-h left"), std::string::npos);

  // the month half gone: bob's 50 GPU-h are a pace of 100, under the credit; 60 would pass it
  r.generated_ms = r.month_start_ms + (r.month_end_ms - r.month_start_ms) / 2;
  r.credits = {ReportCredit{"bob", "team-cv", 50, 60, 100}, ReportCredit{"dave", "team-robotics", 60, 0, 100}};
  a = advise(r);
  ASSERT_EQ(a.suggestions.size(), 1u);
  EXPECT_EQ(a.suggestions[0].subject, "dave (team-robotics)");
  EXPECT_NE(a.suggestions[0].evidence.find("nothing last month; at this pace 120.0 GPU-h by the month's end"),
            std::string::npos)
      << a.suggestions[0].evidence;
  EXPECT_NE(a.suggestions[0].advice.find("on course to exceed"), std::string::npos);
}

TEST(JournalAdvice, TypicalCasesAreTheMostAndLeastEfficientRunOfEachModel) {
  const JournalAdvice a = advise(month_with({job(1, "yolov8s", 1, 2, 0.7, 80, 12), job(2, "yolov8s", 1, 2, 0.3, 80, 12),
                                             job(3, "yolov8s", 1, 2, 0.9, 80, 12), job(4, "yolov8m", 2, 2, 0.5, 80, 30),
                                             job(5, "yolov8m", 2, 2, -1, 80, 30)}));
  ASSERT_EQ(a.typical_cases.size(), 2u);
  EXPECT_EQ(a.typical_cases[0].model, "yolov8m");
  EXPECT_EQ(a.typical_cases[0].runs, 1);
  EXPECT_EQ(a.typical_cases[1].model, "yolov8s");
  EXPECT_EQ(a.typical_cases[1].runs, 3);
  EXPECT_EQ(a.typical_cases[1].most_efficient.lease_id, 3);
  EXPECT_EQ(a.typical_cases[1].least_efficient.lease_id, 2);
}

TEST(JournalAdvice, GpuCountsWithoutNeedlessDecimals) {
  EXPECT_EQ(gpus_text(2), "2");
  EXPECT_EQ(gpus_text(0.25), "0.25");
  EXPECT_EQ(gpus_text(0.5), "0.5");
  EXPECT_EQ(gpus_text(1.0 / 3), "0.33");
  EXPECT_EQ(gpus_text(0), "0");
}

// One lease: grant at `start`, heartbeats every 30 s with `telemetry` (within the policy's 60 s ttl, which caps what
// a gap between heartbeats bills), release after `hours`.
int64_t run_lease(testing::ScriptedHistory& h, int64_t start, const std::string& token, const std::string& body,
                  double hours, const std::string& telemetry) {
  *h.clock = start;
  const ApiResponse r = h.service->handle(testing::api_call("POST", "/v1/leases", token, body));
  EXPECT_EQ(r.status, 201) << r.body.dump();
  if (r.status != 201) return 0;
  const int64_t id = r.body["lease_id"].get<int64_t>();
  const std::string path = "/v1/leases/" + std::to_string(id);
  const int64_t end = start + static_cast<int64_t>(hours * static_cast<double>(kHour));
  for (int64_t t = start; t < end; t += kMinute / 2) {
    *h.clock = t;
    EXPECT_EQ(h.post(path + "/heartbeat", token, telemetry), 200);
  }
  *h.clock = end;
  EXPECT_EQ(h.post(path + "/release", token, R"({"outcome":"completed"})"), 200);
  return id;
}

// November 2026 (the 2nd is a Monday): alice's yolov8s holds a whole 80 GiB GPU for 8 h at 10 % with a 12 GiB
// peak; team-cv holds 12 GPUs (base 8) for 1.5 h in its burst window every weekday morning of the first two weeks; erin
// uses 102 of her 120 GPU-hours (100 and the automatic loan of 20).
TEST(JournalAdvice, AScriptedMonthNamesEachCaseWithItsFigures) {
  const std::string db = testing::temp_db("journal");
  int64_t wasteful = 0;
  {
    testing::ScriptedHistory h(db);
    int64_t nov = 0, end = 0;
    month_range_ms("2026-11", nov, end);
    const int64_t monday = nov + 24 * kHour;
    for (int day = 0; day < 12; ++day) {
      if (day % 7 >= 5) continue;  // weekdays: team-cv's burst window is 08:00-11:00 UTC
      const int64_t morning = monday + day * 24 * kHour + 8 * kHour;
      const char* member = day % 3 == 0 ? "bob-token" : day % 3 == 1 ? "carol-token" : "alice-token";
      run_lease(h, morning, member, R"({"gpus":12,"job":"sweep","model":"yolov8m"})", 1.5,
                R"({"gpu_util":0.9,"memory_used_gib":40})");
    }
    wasteful = run_lease(h, monday + 14 * 24 * kHour + 12 * kHour, "alice-token",
                         R"({"gpus":1,"memory_gib":40,"job":"notebook","model":"yolov8s"})", 8,
                         R"({"gpu_util":0.1,"memory_used_gib":12,"batch":16,"imgsz":640})");
    run_lease(h, monday + 16 * 24 * kHour, "erin-token", R"({"gpus":6,"job":"grasp","model":"yolov8s"})", 17,
              R"({"gpu_util":0.7})");
    h.service->flush_heartbeats();
    ASSERT_FALSE(::testing::Test::HasFailure());
  }
  const Policy policy = testing::example_policy();
  int64_t from = 0, to = 0;
  month_range_ms("2026-12", from, to);
  const MonthlyReport report = build_report(db, "2026-11", &policy, 10, from + kHour);
  const std::string md = report_markdown(report);

  const JournalAdvice advice = advise(report);
  const Suggestion* notebook = nullptr;
  const Suggestion* team = nullptr;
  const Suggestion* credit = nullptr;
  for (const Suggestion& s : advice.suggestions) {
    if (s.subject == "lease " + std::to_string(wasteful) + " notebook (alice, team-cv)") notebook = &s;
    if (s.kind == SuggestionKind::kQuota && s.subject == "team-cv") team = &s;
    if (s.kind == SuggestionKind::kCredit && s.subject == "erin (team-robotics)") credit = &s;
  }
  ASSERT_NE(notebook, nullptr) << md;
  EXPECT_NE(notebook->advice.find("shared=true, memory_gib=15"), std::string::npos) << notebook->advice;
  EXPECT_NE(
      notebook->evidence.find("yolov8s, 1 GPU for 8 h 00 min at 10 % utilisation, 8.0 GPU-h; peak 12.0 GiB of 80 GiB"),
      std::string::npos)
      << notebook->evidence;
  EXPECT_NE(notebook->evidence.find("batch 16 per GPU at 640 px"), std::string::npos) << notebook->evidence;
  ASSERT_NE(team, nullptr) << md;
  EXPECT_NE(team->advice.find("base 8 -> "), std::string::npos) << team->advice;
  EXPECT_EQ(team->advice.find("base 8 -> 8,"), std::string::npos) << team->advice;
  EXPECT_NE(team->evidence.find("held 12 GPUs at the median"), std::string::npos) << team->evidence;
  ASSERT_NE(credit, nullptr) << md;
  EXPECT_EQ(credit->evidence, "102.0 GPU-h of 120.0 GPU-h used (85 %), nothing last month") << md;

  // the journal shows them, the savings and the typical cases
  for (const std::string& text :
       {std::string("## Suggestions"), notebook->advice, team->advice, credit->evidence,
        std::string("## Biggest savings"),
        std::string("| lease ") + std::to_string(wasteful) + " notebook (alice, team-cv) | 8.0 | 1.5 | 6.5 |",
        std::string("## Typical cases"),
        std::string(
            "| yolov8m | 10 | lease 1 sweep (bob): 90 %, 12 GPUs, 18.0 GPU-h at 640 px | (every run at 90 %) |")}) {
    EXPECT_NE(md.find(text), std::string::npos) << text << "\n" << md;
  }
  const std::string csv = report_csv(report);
  EXPECT_NE(csv.find("suggestion,2026-11"), std::string::npos);
  EXPECT_NE(csv.find("typical,2026-11"), std::string::npos);
}

}  // namespace
}  // namespace yolo8::quota
