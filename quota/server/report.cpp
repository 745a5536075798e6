#include "quota/server/report.h"

#include <sqlite3.h>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <iomanip>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <stdexcept>

#include "quota/core/codec.h"
#include "quota/server/metrics.h"
#include "quota/server/status_page.h"

namespace yolo8::quota {

namespace {

constexpr int64_t kMsPerDay = 86400000;

// Days since 1970-01-01 of a proleptic Gregorian date.
int64_t days_from_civil(int y, unsigned m, unsigned d) {
  y -= m <= 2;
  const int64_t era = (y >= 0 ? y : y - 399) / 400;
  const unsigned yoe = unsigned(y - era * 400);
  const unsigned doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
  const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + int64_t(doe) - 719468;
}

struct DbCloser {
  void operator()(sqlite3* db) const { sqlite3_close(db); }
};
struct StmtCloser {
  void operator()(sqlite3_stmt* s) const { sqlite3_finalize(s); }
};
using Db = std::unique_ptr<sqlite3, DbCloser>;
using Stmt = std::unique_ptr<sqlite3_stmt, StmtCloser>;

Stmt prepare(sqlite3* db, const std::string& path, const char* sql) {
  sqlite3_stmt* s = nullptr;
  if (sqlite3_prepare_v2(db, sql, -1, &s, nullptr) != SQLITE_OK) {
    throw std::runtime_error(path + ": not a quotad database (" + sqlite3_errmsg(db) + ")");
  }
  return Stmt(s);
}

std::string column_text(sqlite3_stmt* s, int col) {
  const unsigned char* t = sqlite3_column_text(s, col);
  return t == nullptr ? std::string() : std::string(reinterpret_cast<const char*>(t));
}

int64_t lease_end_ms(const Lease& l) {
  if (is_terminal(l.state)) return l.ended_ms;
  return std::max(l.charged_until_ms, l.last_seen_ms);
}

// GPUs (or memory share) charged per hour; derived from the charged hours when the policy cannot resolve it.
double lease_units(const Lease& l, const Policy* policy) {
  if (!l.shared) return l.gpus;
  if (policy != nullptr && !policy->gpus.empty()) return l.units(*policy);
  const int64_t charged = l.charged_until_ms - l.granted_ms;
  return charged > 0 ? l.gpu_hours / (double(charged) / 3.6e6) : 0;
}

double overlap_hours(const Lease& l, int64_t from, int64_t to) {
  if (l.granted_ms <= 0) return 0;
  const int64_t a = std::max(l.granted_ms, from);
  const int64_t b = std::min(lease_end_ms(l), to);
  return b > a ? double(b - a) / 3.6e6 : 0;
}

struct MonthData {
  std::map<int64_t, LeaseUtil> util;  // per lease, samples inside the month only
};

MonthData read_samples(sqlite3* db, const std::string& path, int64_t from, int64_t to,
                       const std::map<int64_t, Lease>& leases, double below, int64_t after_ms) {
  UtilTracker tracker(below, after_ms);
  Stmt s = prepare(db, path,
                   "SELECT lease_id, ts_ms, gpu_util FROM heartbeats WHERE ts_ms >= ? AND ts_ms < ? "
                   "AND gpu_util IS NOT NULL AND gpu_util >= 0 ORDER BY lease_id, ts_ms");
  sqlite3_bind_int64(s.get(), 1, from);
  sqlite3_bind_int64(s.get(), 2, to);
  while (sqlite3_step(s.get()) == SQLITE_ROW) {
    tracker.observe(sqlite3_column_int64(s.get(), 0), sqlite3_column_int64(s.get(), 1),
                    sqlite3_column_double(s.get(), 2));
  }
  MonthData out;
  for (const auto& [id, u] : tracker.leases()) {
    // a low run lasts until the lease ended (inside the month) or the last sample
    auto it = leases.find(id);
    int64_t end = u.last_ts_ms;
    if (it != leases.end() && is_terminal(it->second.state) && it->second.ended_ms > 0) {
      end = std::clamp(it->second.ended_ms, u.last_ts_ms, to);
    }
    tracker.close(id, end);
    out.util[id] = *tracker.find(id);
  }
  return out;
}

std::string fixed(double v, int digits) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(digits) << v;
  return os.str();
}

std::string pct(double v) { return v < 0 ? "-" : fixed(100 * v, 0) + " %"; }

std::string pct_change(double cur, double prev) {
  if (cur < 0 || prev < 0) return "-";
  const double d = 100 * (cur - prev);
  return (d >= 0 ? "+" : "") + fixed(d, 0) + " pts";
}

std::string hours_change(double cur, double prev) {
  if (prev <= 0) return cur > 0 ? "new" : "-";
  const double d = 100 * (cur - prev) / prev;
  return (d >= 0 ? "+" : "") + fixed(d, 0) + " %";
}

std::string utc_date(int64_t ms) {
  const std::time_t t = std::time_t(ms / 1000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M", &tm);
  return buf;
}

// Markdown table cells must not break the row.
std::string md(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '|') out += "\\|";
    else if (c == '\n' || c == '\r') out += ' ';
    else out += c;
  }
  return out;
}

}  // namespace

void month_range_ms(const std::string& month, int64_t& start_ms, int64_t& end_ms) {
  auto digit = [](char c) { return c >= '0' && c <= '9'; };
  const bool shape = month.size() == 7 && month[4] == '-' && std::all_of(month.begin(), month.begin() + 4, digit) &&
                     digit(month[5]) && digit(month[6]);
  const int y = shape ? std::stoi(month.substr(0, 4)) : 0;
  const int m = shape ? std::stoi(month.substr(5, 2)) : 0;
  if (!shape || m < 1 || m > 12) throw std::invalid_argument("--month: expected YYYY-MM, got '" + month + "'");
  start_ms = days_from_civil(y, unsigned(m), 1) * kMsPerDay;
  end_ms = (m == 12 ? days_from_civil(y + 1, 1, 1) : days_from_civil(y, unsigned(m + 1), 1)) * kMsPerDay;
}

MonthlyReport build_report(const std::string& db_path, const std::string& month, const Policy* policy, int top_n) {
  MonthlyReport r;
  r.month = month;
  int64_t from = 0, to = 0, pfrom = 0, pto = 0;
  month_range_ms(month, from, to);  // validates before anything parses it
  r.prev_month = previous_month_key(month);
  month_range_ms(r.prev_month, pfrom, pto);
  if (policy != nullptr) {
    r.waste_util_below = policy->waste_gpu_util_below;
    r.waste_after_s = policy->waste_after_s;
  }
  sqlite3* raw = nullptr;
  if (sqlite3_open_v2(db_path.c_str(), &raw, SQLITE_OPEN_READONLY, nullptr) != SQLITE_OK) {
    const std::string msg = raw ? sqlite3_errmsg(raw) : "out of memory";
    sqlite3_close(raw);
    throw std::runtime_error(db_path + ": cannot open the quota database: " + msg);
  }
  Db db(raw);
  sqlite3_busy_timeout(db.get(), 10000);

  // leases that may overlap the two months
  std::map<int64_t, Lease> leases;
  {
    Stmt s = prepare(db.get(), db_path,
                     "SELECT body FROM leases WHERE state NOT IN ('released','expired','rejected') OR ended_ms >= ?");
    sqlite3_bind_int64(s.get(), 1, pfrom);
    while (sqlite3_step(s.get()) == SQLITE_ROW) {
      try {
        Lease l = lease_from_json(nlohmann::json::parse(column_text(s.get(), 0)));
        if (l.granted_ms > 0 && l.granted_ms < to) leases[l.id] = std::move(l);
      } catch (const std::exception& e) {
        throw std::runtime_error(db_path + ": unreadable lease record: " + e.what());
      }
    }
  }
  const int64_t after_ms = int64_t(r.waste_after_s) * 1000;
  const MonthData cur = read_samples(db.get(), db_path, from, to, leases, r.waste_util_below, after_ms);
  const MonthData prev = read_samples(db.get(), db_path, pfrom, pto, leases, r.waste_util_below, after_ms);

  auto team_of_user = [&](const std::string& user, const std::string& fallback) {
    if (policy != nullptr) {
      auto it = policy->users.find(user);
      if (it != policy->users.end() && !it->second.team.empty()) return it->second.team;
    }
    return fallback;
  };

  std::map<std::string, ReportTeam> teams;
  if (policy != nullptr) {
    for (const auto& [name, t] : policy->teams) teams[name].team = name;
  }
  struct UtilSum {
    double w = 0, sum = 0;
  };
  std::map<std::string, UtilSum> util_cur, util_prev;
  std::map<std::string, ReportWaste> waste;
  std::vector<ReportJob> jobs;
  for (const auto& [id, l] : leases) {
    const double units = lease_units(l, policy);
    const double h_cur = overlap_hours(l, from, to) * units;
    const double h_prev = overlap_hours(l, pfrom, pto) * units;
    ReportTeam& t = teams[l.req.team];
    t.team = l.req.team;
    t.gpu_hours += h_cur;
    t.prev_gpu_hours += h_prev;
    if (auto it = cur.util.find(id); it != cur.util.end() && it->second.covered_ms > 0) {
      util_cur[l.req.team].w += units * double(it->second.covered_ms);
      util_cur[l.req.team].sum += units * it->second.util_ms;
    }
    if (auto it = prev.util.find(id); it != prev.util.end() && it->second.covered_ms > 0) {
      util_prev[l.req.team].w += units * double(it->second.covered_ms);
      util_prev[l.req.team].sum += units * it->second.util_ms;
    }
    if (h_cur <= 0) continue;
    ++t.leases;
    ReportJob j;
    j.lease_id = id;
    j.team = l.req.team;
    j.user = l.req.user;
    j.job = l.req.job;
    j.model = l.req.model;
    j.state = to_string(l.state);
    j.outcome = to_string(l.outcome);
    j.gpus = units;
    j.gpu_hours = h_cur;
    j.duration_ms = lease_end_ms(l) - l.granted_ms;
    if (auto it = cur.util.find(id); it != cur.util.end()) {
      j.avg_util = it->second.avg_util();
      if (it->second.wasted_ms > 0) {
        ReportWaste& w = waste[l.req.user];
        w.user = l.req.user;
        w.team = l.req.team;
        w.wasted_gpu_hours += units * double(it->second.wasted_ms) / 3.6e6;
        ++w.leases;
        w.longest_low_ms = std::max(w.longest_low_ms, it->second.longest_low_ms);
        t.wasted_gpu_hours += units * double(it->second.wasted_ms) / 3.6e6;
      }
    }
    jobs.push_back(j);
  }
  for (auto& [name, t] : teams) {
    if (util_cur.count(name)) t.avg_util = util_cur[name].sum / util_cur[name].w;
    if (util_prev.count(name)) t.prev_avg_util = util_prev[name].sum / util_prev[name].w;
    r.total_gpu_hours += t.gpu_hours;
    r.prev_total_gpu_hours += t.prev_gpu_hours;
    r.teams.push_back(t);
  }
  std::stable_sort(r.teams.begin(), r.teams.end(),
                   [](const ReportTeam& a, const ReportTeam& b) { return a.gpu_hours > b.gpu_hours; });
  std::stable_sort(jobs.begin(), jobs.end(),
                   [](const ReportJob& a, const ReportJob& b) { return a.gpu_hours > b.gpu_hours; });
  if (int(jobs.size()) > top_n) jobs.resize(size_t(std::max(0, top_n)));
  r.top_jobs = std::move(jobs);
  for (auto& [u, w] : waste) r.waste.push_back(w);
  std::stable_sort(r.waste.begin(), r.waste.end(),
                   [](const ReportWaste& a, const ReportWaste& b) { return a.wasted_gpu_hours > b.wasted_gpu_hours; });

  // credits: quotad's own usage ledger (charged to the month the time was billed in)
  std::map<std::pair<std::string, std::string>, double> usage;
  {
    Stmt s = prepare(db.get(), db_path, "SELECT user, month, gpu_hours FROM usage WHERE month IN (?, ?)");
    sqlite3_bind_text(s.get(), 1, month.c_str(), -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(s.get(), 2, r.prev_month.c_str(), -1, SQLITE_TRANSIENT);
    while (sqlite3_step(s.get()) == SQLITE_ROW) {
      usage[{column_text(s.get(), 0), column_text(s.get(), 1)}] = sqlite3_column_double(s.get(), 2);
    }
  }
  std::map<std::string, std::string> members;  // user -> team
  if (policy != nullptr) {
    for (const auto& [name, t] : policy->teams) {
      for (const auto& m : t.members) members[m] = name;
      for (const auto& m : t.leads) members[m] = name;
    }
  }
  for (const auto& [key, hours] : usage) {
    if (key.second == month && !members.count(key.first)) members[key.first] = team_of_user(key.first, "");
  }
  for (const auto& [id, l] : leases) {
    if (members.count(l.req.user) && members[l.req.user].empty()) members[l.req.user] = l.req.team;
  }
  for (const auto& [user, team] : members) {
    ReportCredit c;
    c.user = user;
    c.team = team;
    auto it = usage.find({user, month});
    c.used = it == usage.end() ? 0 : it->second;
    if (policy != nullptr && policy->monthly_gpu_hours > 0) {
      auto p = usage.find({user, r.prev_month});
      const double debt = std::max(0.0, (p == usage.end() ? 0 : p->second) - policy->monthly_gpu_hours);
      c.allowance = policy->monthly_gpu_hours + policy->loan_gpu_hours - debt;
    }
    r.credits.push_back(c);
  }
  std::stable_sort(r.credits.begin(), r.credits.end(), [](const ReportCredit& a, const ReportCredit& b) {
    return a.team != b.team ? a.team < b.team : a.user < b.user;
  });

  // emergency uses, with the admin's review when there is one
  std::map<int64_t, std::string> reviews;
  {
    Stmt s = prepare(db.get(), db_path, "SELECT lease_id, actor, detail FROM audit WHERE action = 'emergency.reviewed'");
    while (sqlite3_step(s.get()) == SQLITE_ROW) {
      reviews[sqlite3_column_int64(s.get(), 0)] = "reviewed by " + column_text(s.get(), 1) + ": " + column_text(s.get(), 2);
    }
  }
  for (const auto& [id, l] : leases) {
    if (!l.emergency || l.granted_ms < from || l.granted_ms >= to) continue;
    ReportEmergency e;
    e.lease_id = id;
    e.team = l.req.team;
    e.user = l.req.user;
    e.job = l.req.job;
    e.justification = l.req.justification;
    e.granted_ms = l.granted_ms;
    e.gpus = lease_units(l, policy);
    e.gpu_hours = overlap_hours(l, from, to) * e.gpus;
    auto it = reviews.find(id);
    e.review = it != reviews.end() ? it->second : (l.review_pending ? "pending" : "closed");
    r.emergencies.push_back(e);
  }
  return r;
}

std::string report_markdown(const MonthlyReport& r) {
  std::ostringstream os;
  os << "# GPU usage journal " << r.month << "\n\n";
  os << "Total: **" << fixed(r.total_gpu_hours, 1) << " GPU-hours** (" << r.prev_month << ": "
     << fixed(r.prev_total_gpu_hours, 1) << ", " << hours_change(r.total_gpu_hours, r.prev_total_gpu_hours)
     << ").\n\n";
  os << "## Teams\n\n| team | GPU-hours | vs " << r.prev_month
     << " | leases | GPU utilisation | change | idle GPU-hours |\n|---|---:|---:|---:|---:|---:|---:|\n";
  for (const auto& t : r.teams) {
    os << "| " << md(t.team) << " | " << fixed(t.gpu_hours, 1) << " | " << hours_change(t.gpu_hours, t.prev_gpu_hours)
       << " | " << t.leases << " | " << pct(t.avg_util) << " | " << pct_change(t.avg_util, t.prev_avg_util) << " | "
       << fixed(t.wasted_gpu_hours, 1) << " |\n";
  }
  os << "\n## Top jobs\n\n";
  if (r.top_jobs.empty()) {
    os << "No job ran this month.\n";
  } else {
    os << "| lease | team | user | job | model | GPUs | GPU-hours | duration | GPU utilisation | outcome |\n"
       << "|---:|---|---|---|---|---:|---:|---:|---:|---|\n";
    for (const auto& j : r.top_jobs) {
      os << "| " << j.lease_id << " | " << md(j.team) << " | " << md(j.user) << " | " << md(j.job) << " | "
         << md(j.model) << " | " << fixed(j.gpus, j.gpus == std::floor(j.gpus) ? 0 : 2) << " | "
         << fixed(j.gpu_hours, 1) << " | " << format_duration_ms(j.duration_ms) << " | " << pct(j.avg_util) << " | "
         << (j.outcome == "none" ? j.state : j.outcome) << " |\n";
    }
  }
  os << "\n## Waste leaderboard\n\nTime spent below " << fixed(100 * r.waste_util_below, 0)
     << " % GPU utilisation in stretches of at least " << format_duration_ms(int64_t(r.waste_after_s) * 1000)
     << ", times the GPUs held.\n\n";
  if (r.waste.empty()) {
    os << "Nobody left GPUs idle this month.\n";
  } else {
    os << "| rank | user | team | idle GPU-hours | leases | longest idle stretch |\n|---:|---|---|---:|---:|---:|\n";
    int rank = 0;
    for (const auto& w : r.waste) {
      os << "| " << ++rank << " | " << md(w.user) << " | " << md(w.team) << " | " << fixed(w.wasted_gpu_hours, 1)
         << " | " << w.leases << " | " << format_duration_ms(w.longest_low_ms) << " |\n";
    }
  }
  os << "\n## Credits\n\n| user | team | used GPU-hours | allowance | balance |\n|---|---|---:|---:|---:|\n";
  for (const auto& c : r.credits) {
    os << "| " << md(c.user) << " | " << md(c.team) << " | " << fixed(c.used, 1) << " | "
       << (c.allowance < 0 ? "-" : fixed(c.allowance, 1)) << " | " << (c.allowance < 0 ? "-" : fixed(c.balance(), 1))
       << " |\n";
  }
  os << "\n## Emergency uses\n\n";
  if (r.emergencies.empty()) {
    os << "None.\n";
  } else {
    os << "| lease | granted (UTC) | team | user | job | GPUs | GPU-hours | justification | review |\n"
       << "|---:|---|---|---|---|---:|---:|---|---|\n";
    for (const auto& e : r.emergencies) {
      os << "| " << e.lease_id << " | " << utc_date(e.granted_ms) << " | " << md(e.team) << " | " << md(e.user)
         << " | " << md(e.job) << " | " << fixed(e.gpus, 0) << " | " << fixed(e.gpu_hours, 1) << " | "
         << md(e.justification) << " | " << md(e.review) << " |\n";
    }
  }
  return os.str();
}

namespace {

struct Bar {
  std::string label;
  std::vector<double> values;  // one per series
};

// Horizontal grouped bar chart as inline SVG.
std::string svg_bars(const std::string& title, const std::vector<Bar>& bars, const std::vector<std::string>& series,
                     const std::vector<std::string>& colors, int digits, const std::string& unit) {
  const int row_h = 14 * int(series.size()) + 10, label_w = 140, chart_w = 420, top = 28;
  const int height = top + row_h * int(bars.size()) + 24;
  double max_v = 0;
  for (const auto& b : bars) {
    for (double v : b.values) max_v = std::max(max_v, v);
  }
  if (max_v <= 0) max_v = 1;
  std::ostringstream os;
  os << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << label_w + chart_w + 90 << "\" height=\"" << height
     << "\" role=\"img\" aria-label=\"" << html_escape(title) << "\">\n<text x=\"0\" y=\"16\" font-size=\"14\" "
     << "font-weight=\"bold\">" << html_escape(title) << "</text>\n";
  for (size_t i = 0; i < bars.size(); ++i) {
    const int y = top + int(i) * row_h;
    os << "<text x=\"0\" y=\"" << y + 12 << "\" font-size=\"12\">" << html_escape(bars[i].label) << "</text>\n";
    for (size_t s = 0; s < bars[i].values.size(); ++s) {
      const bool missing = bars[i].values[s] < 0;  // no data: an empty bar labelled n/a
      const double v = std::max(0.0, bars[i].values[s]);
      const double w = chart_w * v / max_v;
      const int by = y + int(s) * 14;
      os << "<rect x=\"" << label_w << "\" y=\"" << by << "\" width=\"" << fixed(w, 1) << "\" height=\"12\" fill=\""
         << colors[s % colors.size()] << "\"><title>" << html_escape(series[s]) << ": "
         << (missing ? "n/a" : fixed(v, digits) + unit) << "</title></rect>\n<text x=\"" << label_w + int(w) + 4
         << "\" y=\"" << by + 10 << "\" font-size=\"11\">" << (missing ? "n/a" : fixed(v, digits) + unit) << "</text>\n";
    }
  }
  int x = label_w;
  for (size_t s = 0; s < series.size() && series.size() > 1; ++s) {
    os << "<rect x=\"" << x << "\" y=\"" << height - 14 << "\" width=\"10\" height=\"10\" fill=\""
       << colors[s % colors.size()] << "\"/><text x=\"" << x + 14 << "\" y=\"" << height - 5 << "\" font-size=\"11\">"
       << html_escape(series[s]) << "</text>\n";
    x += 14 + 8 * int(series[s].size()) + 16;
  }
  os << "</svg>\n";
  return os.str();
}

// Markdown tables -> HTML tables; the HTML report reuses the markdown text so both stay in step.
std::string markdown_to_html(const std::string& text) {
  std::ostringstream os;
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
  auto inline_md = [](const std::string& s) {
    std::string e = html_escape(s);
    for (size_t p; (p = e.find("**")) != std::string::npos;) {
      const size_t q = e.find("**", p + 2);
      if (q == std::string::npos) break;
      e = e.substr(0, p) + "<b>" + e.substr(p + 2, q - p - 2) + "</b>" + e.substr(q + 2);
    }
    return e;
  };
  while (std::getline(is, line)) {
    if (!line.empty() && line[0] == '|') {
      if (line.rfind("|---", 0) == 0 || line.rfind("|--", 0) == 0) continue;
      if (!in_table) {
        os << "<table>\n";
        in_table = header = true;
      }
      os << "<tr>";
      for (const auto& c : cells(line)) os << (header ? "<th>" : "<td>") << inline_md(c) << (header ? "</th>" : "</td>");
      os << "</tr>\n";
      header = false;
      continue;
    }
    if (in_table) {
      os << "</table>\n";
      in_table = false;
    }
    if (line.rfind("## ", 0) == 0) {
      os << "<h2>" << inline_md(line.substr(3)) << "</h2>\n";
    } else if (line.rfind("# ", 0) == 0) {
      os << "<h1>" << inline_md(line.substr(2)) << "</h1>\n";
    } else if (!line.empty()) {
      os << "<p>" << inline_md(line) << "</p>\n";
    }
  }
  if (in_table) os << "</table>\n";
  return os.str();
}

}  // namespace

std::string report_html(const MonthlyReport& r) {
  std::vector<Bar> hours, eff, waste;
  for (const auto& t : r.teams) {
    hours.push_back({t.team, {t.prev_gpu_hours, t.gpu_hours}});
    eff.push_back({t.team, {t.prev_avg_util < 0 ? -1 : 100 * t.prev_avg_util, t.avg_util < 0 ? -1 : 100 * t.avg_util}});
  }
  for (const auto& w : r.waste) waste.push_back({w.user + " (" + w.team + ")", {w.wasted_gpu_hours}});
  const std::vector<std::string> months = {r.prev_month, r.month};
  const std::vector<std::string> colors = {"#a9b4c4", "#3b7dd8"};
  std::ostringstream charts;
  charts << "<div class=\"charts\">\n"
         << svg_bars("GPU-hours per team", hours, months, colors, 1, "") << svg_bars("GPU utilisation per team", eff, months, colors, 0, " %");
  if (!waste.empty()) charts << svg_bars("Idle GPU-hours (waste leaderboard)", waste, {r.month}, {"#d8453b"}, 1, "");
  charts << "</div>\n";

  std::string body = markdown_to_html(report_markdown(r));
  // charts go right after the summary line
  const size_t at = body.find("<h2>");
  body.insert(at == std::string::npos ? body.size() : at, charts.str());
  std::ostringstream os;
  os << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>GPU usage journal " << html_escape(r.month)
     << "</title>\n<style>body{font-family:system-ui,sans-serif;margin:24px;color:#1d2330}"
        "table{border-collapse:collapse;margin:8px 0 16px}th,td{border:1px solid #dde1e7;padding:4px 10px;"
        "text-align:left;font-size:13px}th{background:#eef1f5}.charts svg{display:block;margin:12px 0}"
        "svg text{font-family:system-ui,sans-serif}</style></head><body>\n"
     << body << "</body></html>\n";
  return os.str();
}

}  // namespace yolo8::quota
