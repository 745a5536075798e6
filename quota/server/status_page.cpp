#include "quota/server/status_page.h"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <iomanip>
#include <sstream>

namespace yolo8::quota {

std::string html_escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string format_duration_ms(int64_t ms) {
  const int64_t s = std::max<int64_t>(0, ms / 1000);
  std::ostringstream os;
  if (s < 60) {
    os << s << " s";
  } else if (s < 3600) {
    os << s / 60 << " min";
  } else {
    os << s / 3600 << " h " << std::setw(2) << std::setfill('0') << (s % 3600) / 60 << " min";
  }
  return os.str();
}

namespace {

std::string fixed(double v, int digits) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(digits) << v;
  return os.str();
}

std::string pct(double v) { return v < 0 ? "&ndash;" : fixed(100 * v, 0) + " %"; }

std::string utc_time(int64_t ms) {
  const std::time_t t = std::time_t(ms / 1000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S UTC", &tm);
  return buf;
}

constexpr const char* kStyle = R"(
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px;color:#1d2330;background:#f6f7f9}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px}
.sub{color:#5b6475;font-size:13px}
.cards{display:flex;gap:12px;margin-top:14px}
.card{background:#fff;border:1px solid #dde1e7;border-radius:6px;padding:10px 16px;min-width:120px}
.card b{display:block;font-size:22px}
table{border-collapse:collapse;width:100%;background:#fff;border:1px solid #dde1e7;font-size:13px}
th,td{padding:6px 10px;border-bottom:1px solid #eceef2;text-align:left}
td{white-space:nowrap}td:last-child{white-space:normal}
th{background:#eef1f5;font-weight:600}
td.n{text-align:right;font-variant-numeric:tabular-nums}
.bar{position:relative;height:16px;background:#e6e9ee;border-radius:3px;min-width:260px}
.fill{position:absolute;left:0;top:0;bottom:0;background:#3b7dd8;border-radius:3px}
.fill.over{background:#d8453b}
.mark{position:absolute;top:-3px;bottom:-3px;width:2px;background:#1d2330}
.mark.base{background:#7a8494}
.empty{color:#5b6475;font-style:italic}
.waste td{background:#fff4f2}
.legend{font-size:12px;color:#5b6475;margin-top:4px}
)";

}  // namespace

std::string render_status_page(const Policy& policy, const Engine& engine, const UtilTracker& tracker,
                               int64_t now_ms, int refresh_s) {
  const auto teams = team_views(policy, engine, now_ms);
  const auto waste = waste_list(policy, engine, tracker, now_ms);
  double in_use = 0;
  for (const auto& t : teams) in_use += t.status.in_use;
  std::vector<const Lease*> running, queued;
  for (const auto& [id, l] : engine.leases()) {
    if (l.state == LeaseState::kGranted || l.state == LeaseState::kRevoking) running.push_back(&l);
    if (l.state == LeaseState::kQueued) queued.push_back(&l);
  }
  std::sort(queued.begin(), queued.end(), [&](const Lease* a, const Lease* b) {
    return engine.queue_position(a->id) < engine.queue_position(b->id);
  });

  std::ostringstream os;
  os << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n";
  if (refresh_s > 0) os << "<meta http-equiv=\"refresh\" content=\"" << refresh_s << "\">\n";
  os << "<title>quotad status</title>\n<style>" << kStyle << "</style></head><body>\n";
  os << "<h1>GPU use</h1><div class=\"sub\">quotad &middot; " << utc_time(now_ms) << " &middot; read-only</div>\n";
  os << "<div class=\"cards\">"
     << "<div class=\"card\"><b>" << fixed(in_use, 1) << " / " << policy.total_gpus() << "</b>GPUs in use</div>"
     << "<div class=\"card\"><b>" << policy.emergency_pool_gpus() << "</b>emergency pool</div>"
     << "<div class=\"card\"><b>" << running.size() << "</b>running leases</div>"
     << "<div class=\"card\"><b>" << queued.size() << "</b>queued</div>"
     << "<div class=\"card\"><b>" << waste.size() << "</b>on the waste list</div></div>\n";

  os << "<h2>Teams</h2>\n<table id=\"teams\"><tr><th>team</th><th>GPUs in use / quota now</th><th></th>"
     << "<th>base</th><th>burst</th><th>window</th><th>memory used / held (GiB)</th><th>utilisation</th>"
     << "<th>GPU-h this month</th><th>running</th><th>queued</th></tr>\n";
  for (const auto& t : teams) {
    const auto& s = t.status;
    const double scale = std::max({s.burst, s.in_use, 1.0});
    const bool over = s.in_use > s.limit_now + 1e-9;
    os << "<tr><td>" << html_escape(s.name) << "</td><td class=\"n\">" << fixed(s.in_use, 1) << " / "
       << fixed(s.limit_now, 0) << "</td><td><div class=\"bar\" title=\"" << fixed(s.in_use, 1) << " of "
       << fixed(s.limit_now, 0) << "\"><div class=\"fill" << (over ? " over" : "") << "\" style=\"width:"
       << fixed(100 * s.in_use / scale, 1) << "%\"></div><div class=\"mark base\" style=\"left:"
       << fixed(100 * s.base / scale, 1) << "%\"></div><div class=\"mark\" style=\"left:"
       << fixed(std::min(99.5, 100 * s.limit_now / scale), 1) << "%\"></div></div></td>"
       << "<td class=\"n\">" << fixed(s.base, 0) << "</td><td class=\"n\">" << fixed(s.burst, 0) << "</td><td>"
       << (s.in_burst_window ? "burst open" : "&ndash;") << "</td><td class=\"n\">" << fixed(t.memory_used_gib, 0)
       << " / " << fixed(t.memory_allocated_gib, 0) << "</td><td class=\"n\">" << pct(t.gpu_util)
       << "</td><td class=\"n\">" << fixed(t.gpu_hours_month, 1) << "</td><td class=\"n\">" << s.leases_active
       << "</td><td class=\"n\">" << s.queued << "</td></tr>\n";
  }
  os << "</table><div class=\"legend\">Bar: GPUs in use (red above the quota in force); dark mark: quota now; "
        "grey mark: base.</div>\n";

  os << "<h2>Running leases</h2>\n";
  if (running.empty()) {
    os << "<p class=\"empty\">No lease is running.</p>\n";
  } else {
    os << "<table id=\"leases\"><tr><th>lease</th><th>team</th><th>user</th><th>job</th><th>model</th>"
       << "<th>GPUs</th><th>state</th><th>running for</th><th>utilisation now</th><th>mean</th>"
       << "<th>memory (GiB)</th></tr>\n";
    for (const Lease* l : running) {
      const LeaseUtil* u = tracker.find(l->id);
      os << "<tr><td class=\"n\">" << l->id << "</td><td>" << html_escape(l->req.team) << "</td><td>"
         << html_escape(l->req.user) << "</td><td>" << html_escape(l->req.job) << "</td><td>"
         << html_escape(l->req.model) << "</td><td class=\"n\">" << fixed(l->units(policy), l->shared ? 2 : 0)
         << "</td><td>" << to_string(l->state) << (l->emergency ? " (critical)" : "") << "</td><td class=\"n\">"
         << format_duration_ms(now_ms - l->granted_ms) << "</td><td class=\"n\">" << pct(l->telemetry.gpu_util)
         << "</td><td class=\"n\">" << pct(u != nullptr && u->samples > 0 ? u->avg_util() : -1)
         << "</td><td class=\"n\">"
         << (l->telemetry.memory_used_gib >= 0 ? fixed(l->telemetry.memory_used_gib, 1) : "&ndash;")
         << "</td></tr>\n";
    }
    os << "</table>\n";
  }

  os << "<h2>Queue</h2>\n";
  if (queued.empty()) {
    os << "<p class=\"empty\">Nobody is waiting.</p>\n";
  } else {
    os << "<table id=\"queue\"><tr><th>#</th><th>lease</th><th>team</th><th>user</th><th>job</th><th>GPUs</th>"
       << "<th>priority</th><th>waiting for</th><th>why</th></tr>\n";
    for (const Lease* l : queued) {
      const AcquireResult q = engine.status_of(l->id, now_ms);
      os << "<tr><td class=\"n\">" << q.position << "</td><td class=\"n\">" << l->id
         << "</td><td>" << html_escape(l->req.team) << "</td><td>" << html_escape(l->req.user) << "</td><td>"
         << html_escape(l->req.job) << "</td><td class=\"n\">" << l->gpus << "</td><td>"
         << to_string(l->req.priority) << "</td><td class=\"n\">" << format_duration_ms(now_ms - l->created_ms)
         << "</td><td>" << html_escape(q.reason) << "</td></tr>\n";
    }
    os << "</table>\n";
  }

  os << "<h2>Waste list</h2>\n<div class=\"sub\">Running leases below " << fixed(100 * policy.waste_gpu_util_below, 0)
     << " % GPU utilisation for at least " << format_duration_ms(int64_t(policy.waste_after_s) * 1000) << ".</div>\n";
  if (waste.empty()) {
    os << "<p class=\"empty\">No idle lease.</p>\n";
  } else {
    os << "<table id=\"waste\" class=\"waste\"><tr><th>lease</th><th>team</th><th>user</th><th>job</th>"
       << "<th>GPUs</th><th>below threshold for</th><th>utilisation now</th><th>idle GPU-hours</th></tr>\n";
    for (const auto& w : waste) {
      os << "<tr><td class=\"n\">" << w.lease_id << "</td><td>" << html_escape(w.team) << "</td><td>"
         << html_escape(w.user) << "</td><td>" << html_escape(w.job) << "</td><td class=\"n\">" << fixed(w.units, 0)
         << "</td><td class=\"n\">" << format_duration_ms(w.low_ms) << "</td><td class=\"n\">" << pct(w.last_util)
         << "</td><td class=\"n\">" << fixed(w.wasted_gpu_hours, 1) << "</td></tr>\n";
    }
    os << "</table>\n";
  }
  os << "<p class=\"sub\">Live figures: <a href=\"/metrics\">/metrics</a> (Prometheus).</p>\n</body></html>\n";
  return os.str();
}

std::string render_status_page(QuotaService& service) {
  std::string html;
  service.observe([&](const ServiceView& view) {
    html = render_status_page(view.policy, view.engine, view.tracker, view.now_ms);
  });
  return html;
}

}  // namespace yolo8::quota
