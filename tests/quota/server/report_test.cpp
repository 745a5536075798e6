// `quotad report`: a scripted October and November in a real quotad database, with expected figures.
#include "quota/server/report.h"

#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "quota/server/history.h"
#include "quota/server/statement.h"
#include "quota/store/store.h"
#include "tests/quota/visibility_util.h"

namespace yolo8::quota {
namespace {

using testing::kHour;
using testing::kMinute;

std::string temp_path(const std::string& name) {
  const std::string dir = std::string(yolo8::test::kBinaryDir) + "/quota_test_tmp";
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/" + name + "_" + std::to_string(::getpid());
  for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(path + suffix);
  return path;
}

int64_t month_start(const std::string& month) {
  int64_t a = 0, b = 0;
  month_range_ms(month, a, b);
  return a;
}

// One lease at a time: grant at `start`, heartbeats every 30 s at `util` (within the policy's 60 s ttl, so each
// gap is billed whole) up to its release after `hours` (billed to the last heartbeat plus at most one interval).
void run_lease(testing::ScriptedHistory& h, int64_t start, const std::string& token, const std::string& body,
               double hours, double util) {
  *h.clock = start;
  const ApiResponse r = h.service->handle(testing::api_call("POST", "/v1/leases", token, body));
  ASSERT_EQ(r.status, 201) << r.body.dump();
  const int64_t id = r.body["lease_id"].get<int64_t>();
  const std::string path = "/v1/leases/" + std::to_string(id);
  const int64_t end = start + static_cast<int64_t>(hours * static_cast<double>(kHour));
  for (int64_t t = start; t <= end; t += kMinute / 2) {
    *h.clock = t;
    ASSERT_EQ(h.post(path + "/heartbeat", token, R"({"gpu_util":)" + std::to_string(util) + "}"), 200);
  }
  *h.clock = end;
  ASSERT_EQ(h.post(path + "/release", token, R"({"outcome":"completed"})"), 200);
}

// October: alice 2 GPUs x 10 h at 50 % (lease 1), erin 1 GPU x 4 h at 90 % (2).
// November: alice 4 GPUs x 5 h at 80 % (3), bob 2 GPUs x 3 h at 5 % (4, idle), erin a critical 2 GPUs x 2 h at
// 60 % (5, reviewed by admin), erin 1 GPU x 2 h at 70 % (6).
std::string scripted_db() {
  const std::string db = temp_path("report.db");
  testing::ScriptedHistory h(db);
  const int64_t oct = month_start("2026-10") + 4 * 24 * kHour + 10 * kHour;
  run_lease(h, oct, "alice-token", R"({"gpus":2,"job":"oct-train","model":"yolov8s"})", 10, 0.5);
  run_lease(h, oct + 11 * kHour, "erin-token", R"({"gpus":1,"job":"oct-rob","model":"yolov8s"})", 4, 0.9);
  const int64_t nov = month_start("2026-11") + 9 * 24 * kHour + 8 * kHour;
  run_lease(h, nov, "alice-token", R"({"gpus":4,"job":"big-train","model":"yolov8m"})", 5, 0.8);
  run_lease(h, nov + 6 * kHour, "bob-token", R"({"gpus":2,"job":"idle-notebook","model":"yolov8s"})", 3, 0.05);
  run_lease(
      h, nov + 10 * kHour, "erin-token",
      R"({"gpus":2,"job":"hotfix","model":"yolov8s","priority":"critical","justification":"safety | recall fix for the demo"})",
      2, 0.6);
  if (::testing::Test::HasFatalFailure()) return db;
  *h.clock += kMinute;
  EXPECT_EQ(h.post("/v1/leases/5/review", "admin-token", R"({"note":"justified"})"), 200);
  run_lease(h, nov + 13 * kHour, "erin-token", R"({"gpus":1,"job":"rob-eval","model":"yolov8s"})", 2, 0.7);
  h.service->flush_heartbeats();
  return db;
}

class QuotadReport : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { db_ = new std::string(scripted_db()); }
  static void TearDownTestSuite() { delete db_; }
  static std::string* db_;
};
std::string* QuotadReport::db_ = nullptr;

const ReportTeam* team(const MonthlyReport& r, const std::string& name) {
  for (const auto& t : r.teams) {
    if (t.team == name) return &t;
  }
  return nullptr;
}

TEST_F(QuotadReport, TeamHoursAndEfficiency) {
  const Policy p = testing::example_policy();
  const MonthlyReport r = build_report(*db_, "2026-11", &p);
  EXPECT_EQ(r.prev_month, "2026-10");
  EXPECT_DOUBLE_EQ(r.total_gpu_hours, 20 + 6 + 4 + 2);
  EXPECT_DOUBLE_EQ(r.prev_total_gpu_hours, 20 + 4);
  ASSERT_EQ(r.teams.size(), 3u);
  EXPECT_EQ(r.teams[0].team, "team-cv");  // most GPU-hours first
  const ReportTeam* cv = team(r, "team-cv");
  ASSERT_NE(cv, nullptr);
  EXPECT_DOUBLE_EQ(cv->gpu_hours, 26);
  EXPECT_DOUBLE_EQ(cv->prev_gpu_hours, 20);
  EXPECT_EQ(cv->leases, 2);
  EXPECT_NEAR(cv->avg_util, (20 * 0.8 + 6 * 0.05) / 26, 1e-9);
  EXPECT_NEAR(cv->prev_avg_util, 0.5, 1e-9);
  EXPECT_NEAR(cv->wasted_gpu_hours, 6, 1e-9);
  const ReportTeam* rob = team(r, "team-robotics");
  ASSERT_NE(rob, nullptr);
  EXPECT_DOUBLE_EQ(rob->gpu_hours, 6);
  EXPECT_NEAR(rob->avg_util, (4 * 0.6 + 2 * 0.7) / 6, 1e-9);
  EXPECT_NEAR(rob->prev_avg_util, 0.9, 1e-9);
  const ReportTeam* interns = team(r, "team-interns");
  ASSERT_NE(interns, nullptr);
  EXPECT_EQ(interns->gpu_hours, 0);
  EXPECT_EQ(interns->avg_util, -1);
}

TEST_F(QuotadReport, TopJobsWasteCreditsEmergencies) {
  const Policy p = testing::example_policy();
  const MonthlyReport r = build_report(*db_, "2026-11", &p, 3);
  ASSERT_EQ(r.top_jobs.size(), 3u);
  EXPECT_EQ(r.top_jobs[0].job, "big-train");
  EXPECT_DOUBLE_EQ(r.top_jobs[0].gpu_hours, 20);
  EXPECT_EQ(r.top_jobs[0].duration_ms, 5 * kHour);
  EXPECT_NEAR(r.top_jobs[0].avg_util, 0.8, 1e-9);
  EXPECT_EQ(r.top_jobs[0].outcome, Outcome::kCompleted);
  EXPECT_EQ(r.top_jobs[1].job, "idle-notebook");
  EXPECT_EQ(r.top_jobs[2].job, "hotfix");

  ASSERT_EQ(r.waste.size(), 1u);
  EXPECT_EQ(r.waste[0].user, "bob");
  EXPECT_NEAR(r.waste[0].wasted_gpu_hours, 6, 1e-9);
  EXPECT_EQ(r.waste[0].longest_low_ms, 3 * kHour);

  std::map<std::string, ReportCredit> credits;
  for (const auto& c : r.credits) credits[c.user] = c;
  EXPECT_NEAR(credits["alice"].used, 20, 1e-9);
  EXPECT_DOUBLE_EQ(credits["alice"].allowance, 120);  // 100 + 20 loan, no overrun in October
  EXPECT_NEAR(credits["alice"].balance(), 100, 1e-9);
  EXPECT_NEAR(credits["bob"].used, 6, 1e-9);
  EXPECT_EQ(credits["bob"].team, "team-cv");
  EXPECT_NEAR(credits["erin"].used, 6, 1e-9);
  EXPECT_EQ(credits["ivan"].used, 0);  // members without use are listed too
  EXPECT_EQ(credits["ivan"].team, "team-interns");

  ASSERT_EQ(r.emergencies.size(), 1u);
  EXPECT_EQ(r.emergencies[0].user, "erin");
  EXPECT_EQ(r.emergencies[0].justification, "safety | recall fix for the demo");
  EXPECT_EQ(r.emergencies[0].review, "reviewed by admin: justified");
  EXPECT_DOUBLE_EQ(r.emergencies[0].gpu_hours, 4);

  // October had no waste and no emergency
  const MonthlyReport oct = build_report(*db_, "2026-10", &p);
  EXPECT_TRUE(oct.waste.empty());
  EXPECT_TRUE(oct.emergencies.empty());
  EXPECT_DOUBLE_EQ(oct.total_gpu_hours, 24);
}

TEST_F(QuotadReport, MarkdownAndHtml) {
  const Policy p = testing::example_policy();
  const MonthlyReport r = build_report(*db_, "2026-11", &p);
  const std::string md = report_markdown(r);
  EXPECT_NE(md.find("# GPU usage journal 2026-11"), std::string::npos);
  EXPECT_NE(md.find("Total: **32.0 GPU-hours** (2026-10: 24.0, +33 %)"), std::string::npos) << md;
  EXPECT_NE(md.find("| team-cv | 26.0 | +30 % | 2 | 63 % | +13 pts | 6.0 |"), std::string::npos) << md;
  EXPECT_NE(md.find("| team-robotics | 6.0 | +50 % | 2 | 63 % | -27 pts | 0.0 |"), std::string::npos) << md;
  EXPECT_NE(md.find("| 1 | bob | team-cv | 6.0 | 1 | 3 h 00 min |"), std::string::npos) << md;
  EXPECT_NE(md.find("| alice | team-cv | 20.0 | 120.0 | 100.0 |"), std::string::npos) << md;
  EXPECT_NE(md.find("safety \\| recall fix for the demo"), std::string::npos) << md;  // escaped pipe
  const std::string html = report_html(r);
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("<svg"), html.find("<svg xmlns"));
  size_t svgs = 0;
  for (size_t at = html.find("<svg"); at != std::string::npos; at = html.find("<svg", at + 1)) ++svgs;
  EXPECT_EQ(svgs, 3u);  // GPU-hours, utilisation, waste
  // team-cv's November bar is the longest of the GPU-hours chart: 420 px
  EXPECT_NE(html.find("width=\"420.0\" height=\"12\" fill=\"#3b7dd8\"><title>2026-11: 26.0</title>"),
            std::string::npos);
  EXPECT_NE(html.find(">n/a</text>"), std::string::npos);  // team-interns reported no utilisation
  EXPECT_NE(html.find("<td>safety | recall fix for the demo</td>"), std::string::npos);
  EXPECT_NE(html.find("<td>reviewed by admin: justified</td>"), std::string::npos);
  // numbers right-aligned: the markdown's `---:` columns become class="n" cells
  EXPECT_NE(html.find("<td>team-cv</td><td class=\"n\">26.0</td>"), std::string::npos) << html;
  EXPECT_NE(html.find("<th class=\"n\">GPU-hours</th>"), std::string::npos);
  EXPECT_NE(html.find("td.n{text-align:right"), std::string::npos);
  EXPECT_NE(md.find("| 4 | team-cv | bob | idle-notebook |"), std::string::npos);
  EXPECT_NE(md.find("| completed |"), std::string::npos);
}

// A job without an outcome (it expired, or still runs) shows its state in the outcome column, not an empty cell.
TEST(QuotadReportMarkdown, JobWithoutOutcomeShowsItsState) {
  MonthlyReport report;
  report.month = "2026-11";
  report.prev_month = "2026-10";
  ReportJob expired;
  expired.lease_id = 7;
  expired.job = "lost-node";
  expired.state = LeaseState::kExpired;
  expired.outcome = Outcome::kNone;
  report.top_jobs = {expired};
  const std::string markdown = report_markdown(report);
  EXPECT_NE(markdown.find("| expired (no heartbeat) |\n"), std::string::npos) << markdown;
}

TEST(QuotadReportMarkdown, EveryLeaseHasAnOutcome) {
  EXPECT_EQ(lease_outcome(LeaseState::kGranted, Outcome::kNone), "running");
  EXPECT_EQ(lease_outcome(LeaseState::kRevoking, Outcome::kNone), "revoking");
  EXPECT_EQ(lease_outcome(LeaseState::kReleased, Outcome::kCompleted), "completed");
  EXPECT_EQ(lease_outcome(LeaseState::kReleased, Outcome::kPreempted), "preempted");
  EXPECT_EQ(lease_outcome(LeaseState::kExpired, Outcome::kPreempted), "revoked (deadline passed)");
  EXPECT_EQ(lease_outcome(LeaseState::kExpired, Outcome::kNone), "expired (no heartbeat)");
  for (auto state : {LeaseState::kPendingApproval, LeaseState::kQueued, LeaseState::kGranted, LeaseState::kRevoking,
                     LeaseState::kReleased, LeaseState::kExpired, LeaseState::kRejected}) {
    for (auto outcome :
         {Outcome::kNone, Outcome::kCompleted, Outcome::kPreempted, Outcome::kFailed, Outcome::kCancelled}) {
      EXPECT_FALSE(lease_outcome(state, outcome).empty()) << to_string(state) << " " << to_string(outcome);
    }
  }
}

// The issue's case: three teams at 0.26 GPU-hours each were shown as 0.3 + 0.3 + 0.3 = 0.9 against a total of 0.8.
MonthlyReport three_small_teams() {
  MonthlyReport report;
  report.month = "2026-11";
  report.prev_month = "2026-10";
  report.generated_ms = 1;
  report.month_end_ms = 2;
  for (const char* name : {"a", "b", "c"}) {
    ReportTeam team;
    team.team = name;
    team.gpu_hours = 0.26;
    team.wasted_gpu_hours = 0.05;
    team.leases = 1;
    report.teams.push_back(team);
    report.total_gpu_hours += team.gpu_hours;
  }
  return report;
}

TEST(QuotadReportMarkdown, TeamRowsAddUpToTheTotal) {
  EXPECT_EQ(round_to_total({0.26, 0.26, 0.26}, 1), (std::vector<double>{0.3, 0.3, 0.2}));
  EXPECT_EQ(round_to_total({1.04, 2.04, 3.04}, 1), (std::vector<double>{1.1, 2.0, 3.0}));
  EXPECT_EQ(round_to_total({}, 1), std::vector<double>{});
  const std::string md = report_markdown(three_small_teams());
  EXPECT_NE(md.find("Total: **0.8 GPU-hours**"), std::string::npos) << md;
  // the shown team figures, read back from the table, add up to the shown total
  double rows = 0;
  std::istringstream is(md);
  std::string line;
  while (std::getline(is, line)) {
    if (line.rfind("| a |", 0) == 0 || line.rfind("| b |", 0) == 0 || line.rfind("| c |", 0) == 0) {
      rows += std::stod(line.substr(6, line.find(" |", 6) - 6));
    }
  }
  EXPECT_NEAR(rows, 0.8, 1e-9) << md;
  EXPECT_NE(md.find("| **total** | **0.8** |"), std::string::npos) << md;
  EXPECT_NE(md.find("| **3** | | | **0.2** |"), std::string::npos) << md;  // leases and idle GPU-hours too
}

TEST(QuotadReportMarkdown, GeneratedAtAndMonthInProgress) {
  MonthlyReport report = three_small_teams();
  int64_t from = 0, to = 0;
  month_range_ms("2026-11", from, to);
  report.month_end_ms = to;
  report.generated_ms = from + 19 * 24 * testing::kHour + 12 * testing::kHour;
  std::string md = report_markdown(report);
  EXPECT_NE(md.find("Generated at 2026-11-20 12:00 UTC."), std::string::npos) << md;
  EXPECT_NE(md.find("The month is still running (it ends 2026-12-01 00:00 UTC)"), std::string::npos) << md;
  report.generated_ms = to + testing::kHour;
  md = report_markdown(report);
  EXPECT_NE(md.find("Generated at 2026-12-01 01:00 UTC."), std::string::npos) << md;
  EXPECT_EQ(md.find("still running"), std::string::npos) << md;
}

TEST(QuotadReportMarkdown, CsvIsOneTableWhoseTeamsAddUpToTheTotal) {
  MonthlyReport report = three_small_teams();
  ReportEmergency emergency;
  emergency.lease_id = 9;
  emergency.justification = "outage, \"prod\"\nline two";
  emergency.review = "pending";
  report.emergencies = {emergency};
  const std::string csv = report_csv(report);
  std::istringstream is(csv);
  std::string header;
  std::getline(is, header);
  EXPECT_EQ(header.rfind("record,month,team,user,lease,job,", 0), 0u) << header;
  EXPECT_EQ(header.back(), '\r');  // RFC 4180 line ends
  EXPECT_NE(csv.find("report,2026-11,"), std::string::npos);
  EXPECT_NE(csv.find("month in progress"), std::string::npos);
  EXPECT_NE(csv.find("team,2026-11,a,,,,,,0.260,"), std::string::npos) << csv;
  EXPECT_NE(csv.find("total,2026-11,,,,,,,0.780,0.000,3,,0.150,"), std::string::npos) << csv;
  EXPECT_NE(csv.find("\"outage, \"\"prod\"\"\nline two\""), std::string::npos) << csv;  // quoted, quotes doubled
  size_t columns = 1;
  for (char c : header) columns += c == ',';
  std::string row;
  std::getline(is, row);  // the report row: as many fields as the header
  size_t fields = 1;
  for (char c : row) fields += c == ',';
  EXPECT_EQ(fields, columns) << row;
}

TEST_F(QuotadReport, WithoutPolicyAndBadInput) {
  const MonthlyReport r = build_report(*db_, "2026-11", nullptr);
  EXPECT_DOUBLE_EQ(r.total_gpu_hours, 32);
  EXPECT_EQ(r.teams.size(), 2u);  // only teams seen in the database
  for (const auto& c : r.credits) EXPECT_LT(c.allowance, 0);
  EXPECT_THROW(build_report(*db_, "2026-13", nullptr), std::invalid_argument);
  EXPECT_THROW(build_report(*db_, "nov", nullptr), std::invalid_argument);
  EXPECT_THROW(build_report(temp_path("missing.db"), "2026-11", nullptr), std::runtime_error);
}

// Bounded history: heartbeats folded into hourly summaries, in part (the cut in the middle of a lease and of an
// hour) or whole, leave the report, the statement and recommend's history exactly as they were.
TEST_F(QuotadReport, FoldedHeartbeatsLeaveTheReportStatementAndHistoryUnchanged) {
  const Policy p = testing::example_policy();
  const int64_t now = month_start("2026-12") + 20 * 24 * kHour;
  const auto figures = [&](const std::string& db) {
    std::vector<std::string> out;
    for (const char* month : {"2026-10", "2026-11"}) {
      const MonthlyReport report = build_report(db, month, &p, 10, now);
      out.push_back(report_markdown(report));
      out.push_back(report_csv(report));
      out.push_back(report_html(report));
    }
    out.push_back(statement_markdown(build_statement(db, "2026-Q4", p, now)));
    const int64_t window_from = month_start("2026-10") + 4 * 24 * kHour + 13 * kHour + 17 * kMinute;
    std::ostringstream history;
    history.precision(17);
    for (const HistoryLease& lease : load_history(db, p, window_from, now).leases) {
      history << lease.id << " " << lease.sampled_gpu_hours << " " << lease.idle_gpu_hours << "\n";
    }
    out.push_back(history.str());
    return out;
  };
  const std::vector<std::string> raw = figures(*db_);
  ASSERT_NE(raw[3].find("idle-notebook"), std::string::npos);  // the November report lists the idle lease
  // in the middle of November's first lease (granted 08:00, 5 h) and of an hour
  const int64_t cuts[] = {month_start("2026-11") + 9 * 24 * kHour + 10 * kHour + 20 * kMinute, now};
  for (const int64_t cut : cuts) {
    const std::string copy = temp_path("report_folded.db");
    std::filesystem::copy_file(*db_, copy, std::filesystem::copy_options::overwrite_existing);
    int64_t left = 0;
    {
      Store store(copy);
      const int64_t before = store.count_heartbeats();
      int steps = 0;
      while (store.fold_heartbeats(cut, cut, p.waste_gpu_util_below, int64_t{p.waste_after_s} * 1000, 300) > 0) {
        ++steps;
      }
      left = store.count_heartbeats();
      EXPECT_GT(steps, 2);
      EXPECT_LT(left, before);
      EXPECT_GT(store.count_heartbeat_hours(), 0);
    }
    EXPECT_EQ(left > 0, cut != now) << cut;
    const std::vector<std::string> folded = figures(copy);
    ASSERT_EQ(folded.size(), raw.size());
    for (size_t i = 0; i < raw.size(); ++i) EXPECT_EQ(folded[i], raw[i]) << "figure " << i << ", cut at " << cut;
  }
}

TEST_F(QuotadReport, CommandLine) {
  const std::string bin = std::string(yolo8::test::kBinaryDir) + "/quota/quotad";
  const std::string out = temp_path("report.html");
  const std::string cmd = bin + " report --month 2026-11 --format html --db " + *db_ + " --policy " +
                          testing::example_policy_path() + " --out " + out;
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream in(out);
  std::stringstream ss;
  ss << in.rdbuf();
  EXPECT_NE(ss.str().find("<svg"), std::string::npos);
  const std::string csv_out = temp_path("report.csv");
  const std::string csv_cmd = bin + " report --month 2026-11 --format csv --db " + *db_ + " --out " + csv_out;
  ASSERT_EQ(std::system(csv_cmd.c_str()), 0) << csv_cmd;
  std::ifstream csv_in(csv_out);
  std::stringstream csv;
  csv << csv_in.rdbuf();
  EXPECT_NE(csv.str().find("total,2026-11,,,,,,,32.000,24.000,"), std::string::npos) << csv.str();
  const std::string bad = bin + " report --month 2026-11 --format pdf --db " + *db_ + " > /dev/null 2>&1";
  EXPECT_NE(std::system(bad.c_str()), 0);
}

}  // namespace
}  // namespace yolo8::quota
