#include "quota/server/status_page.h"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <sstream>

#include "quota/core/api.h"
#include "quota/core/calendar.h"
#include "quota/server/metrics.h"

namespace yolo8::quota {

std::string html_escape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char character : text) {
    switch (character) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += character;
    }
  }
  return out;
}

std::string device_memory_text(double process_gib, double device_gib) {
  const std::string device = device_gib >= 0 ? "device " + fixed_text(device_gib, 1) + " GiB" : "";
  if (process_gib < 0) return device;
  return "process " + fixed_text(process_gib, 1) + " GiB" + (device.empty() ? "" : " of " + device);
}

std::string format_duration_ms(int64_t ms) {
  const int64_t seconds = std::max<int64_t>(0, ms / 1000);
  std::ostringstream stream;
  if (seconds < 60) {
    stream << seconds << " s";
  } else if (seconds < 3600) {
    stream << seconds / 60 << " min";
  } else {
    stream << seconds / 3600 << " h " << std::setw(2) << std::setfill('0') << (seconds % 3600) / 60 << " min";
  }
  return stream.str();
}

namespace {

std::string percent(double fraction) { return fraction < 0 ? "&ndash;" : fixed_text(100 * fraction, 0) + " %"; }

constexpr const char* kStyle = R"(
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px;color:#1d2330;background:#f6f7f9}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px}
.sub{color:#5b6475;font-size:13px}
.cards{display:flex;flex-wrap:wrap;gap:12px;margin-top:14px}
.card{background:#fff;border:1px solid #dde1e7;border-radius:6px;padding:10px 16px;min-width:120px}
.card b{display:block;font-size:22px}
table{border-collapse:collapse;width:100%;background:#fff;border:1px solid #dde1e7;font-size:13px}
th,td{padding:6px 10px;border-bottom:1px solid #eceef2;text-align:left}
td{white-space:nowrap}td:last-child{white-space:normal;min-width:14em}
th{background:#eef1f5;font-weight:600}
td.n{text-align:right;font-variant-numeric:tabular-nums}
.bar{position:relative;height:16px;background:#e6e9ee;border-radius:3px;min-width:160px}
.fill{position:absolute;left:0;top:0;bottom:0;background:#3b7dd8;border-radius:3px}
.fill.over{background:#d8453b}
.mark{position:absolute;top:-3px;bottom:-3px;width:2px;background:#1d2330}
.mark.base{background:#7a8494}
.empty{color:#5b6475;font-style:italic}
.waste td{background:#fff4f2}
.legend{font-size:12px;color:#5b6475;margin-top:4px}
.scroll{overflow-x:auto;max-width:100%}
@media (max-width:600px){body{margin:12px}.card{min-width:0;flex:1 1 30%}.card b{font-size:18px}}
)";

}  // namespace

std::string render_status_page(const Policy& policy, const Engine& engine, const UtilTracker& tracker, int64_t now_ms,
                               int refresh_s) {
  const auto teams = team_views(policy, engine, now_ms);
  const auto waste = waste_list(policy, engine, tracker, now_ms);
  // the same figures as quotad_gpus_allocated / _free: emergency leases are held GPUs too
  const GpuAllocation allocation = gpu_allocation(policy, engine, now_ms);
  std::vector<const Lease*> running, queued;
  for (const auto& [id, lease] : engine.leases()) {
    if (lease.state == LeaseState::kGranted || lease.state == LeaseState::kRevoking) running.push_back(&lease);
    if (lease.state == LeaseState::kQueued) queued.push_back(&lease);
  }
  std::sort(queued.begin(), queued.end(), [&](const Lease* left, const Lease* right) {
    return engine.queue_position(left->id) < engine.queue_position(right->id);
  });

  std::ostringstream html;
  html << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
       << "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n";
  if (refresh_s > 0) html << "<meta http-equiv=\"refresh\" content=\"" << refresh_s << "\">\n";
  html << "<title>quotad status</title>\n<style>" << kStyle << "</style></head><body>\n";
  html << "<h1>GPU use</h1><div class=\"sub\">quotad &middot; " << utc_text(now_ms, "%Y-%m-%d %H:%M:%S UTC")
       << " &middot; read-only</div>\n";
  html << "<div class=\"cards\">"
       << "<div class=\"card\" id=\"gpus-in-use\"><b>" << fixed_text(allocation.allocated, 2) << " / "
       << policy.total_gpus() << "</b>GPUs in use</div>"
       << "<div class=\"card\" id=\"gpus-free\"><b>" << fixed_text(allocation.free(), 2) << "</b>GPUs free</div>"
       << "<div class=\"card\" id=\"gpus-emergency\"><b>" << fixed_text(allocation.emergency, 2) << " / "
       << policy.emergency_pool_gpus() << "</b>emergency leases / pool</div>"
       << "<div class=\"card\"><b>" << running.size() << "</b>running leases</div>"
       << "<div class=\"card\"><b>" << queued.size() << "</b>queued</div>"
       << "<div class=\"card\"><b>" << waste.size() << "</b>on the waste list</div></div>\n";

  html << "<h2>Teams</h2>\n<div class=\"scroll\"><table id=\"teams\"><tr><th>team</th><th>GPUs in use / quota "
          "now</th><th></th>"
       << "<th>base</th><th>burst</th><th>window</th><th>memory used / held (GiB)</th><th>utilisation</th>"
       << "<th>GPU-h this month</th><th>running</th><th>queued</th></tr>\n";
  for (const auto& team : teams) {
    const auto& status = team.status;
    const double scale = std::max({status.burst, status.in_use, 1.0});
    const bool over = status.in_use > status.limit_now + 1e-9;
    html << "<tr><td>" << html_escape(status.name) << "</td><td class=\"n\">" << fixed_text(status.in_use, 1) << " / "
         << fixed_text(status.limit_now, 0) << "</td><td><div class=\"bar\" title=\"" << fixed_text(status.in_use, 1)
         << " of " << fixed_text(status.limit_now, 0) << "\"><div class=\"fill" << (over ? " over" : "")
         << "\" style=\"width:" << fixed_text(100 * status.in_use / scale, 1)
         << "%\"></div><div class=\"mark base\" style=\"left:" << fixed_text(100 * status.base / scale, 1)
         << "%\"></div><div class=\"mark\" style=\"left:"
         << fixed_text(std::min(99.5, 100 * status.limit_now / scale), 1) << "%\"></div></div></td>"
         << "<td class=\"n\">" << fixed_text(status.base, 0) << "</td><td class=\"n\">" << fixed_text(status.burst, 0)
         << "</td><td>" << (status.in_burst_window ? "burst open" : "&ndash;") << "</td><td class=\"n\">"
         << fixed_text(team.memory_used_gib, 0) << " / " << fixed_text(team.memory_allocated_gib, 0)
         << "</td><td class=\"n\">" << percent(team.gpu_util) << "</td><td class=\"n\">"
         << fixed_text(team.gpu_hours_month, 1) << "</td><td class=\"n\">" << status.leases_active
         << "</td><td class=\"n\">" << status.queued << "</td></tr>\n";
  }
  html << "</table></div><div class=\"legend\">Bar: GPUs in use (red above the quota in force); dark mark: quota now; "
          "grey mark: base.</div>\n";

  html << "<h2>Running leases</h2>\n";
  if (running.empty()) {
    html << "<p class=\"empty\">No lease is running.</p>\n";
  } else {
    html << "<div class=\"scroll\"><table "
            "id=\"leases\"><tr><th>lease</th><th>team</th><th>user</th><th>job</th><th>model</th>"
         << "<th>GPUs</th><th>state</th><th>running for</th><th>utilisation now</th><th>mean</th>"
         << "<th>memory peak (GiB)</th><th>on the GPU</th></tr>\n";
    for (const Lease* lease : running) {
      const LeaseUtil* util = tracker.find(lease->id);
      html << "<tr><td class=\"n\">" << lease->id << "</td><td>" << html_escape(lease->req.team) << "</td><td>"
           << html_escape(lease->req.user) << "</td><td>" << html_escape(lease->req.job) << "</td><td>"
           << html_escape(lease->req.model) << "</td><td class=\"n\" title=\""
           << html_escape(engine.describe_devices(*lease)) << "\">"  // which GPUs, and how they were matched
           << fixed_text(lease->units(policy), lease->shared ? 2 : 0) << "</td><td>" << to_string(lease->state)
           << (lease->emergency ? " (critical)" : "") << "</td><td class=\"n\">"
           << format_duration_ms(now_ms - lease->granted_ms) << "</td><td class=\"n\">"
           << percent(lease->telemetry.gpu_util) << "</td><td class=\"n\">"
           << percent(util != nullptr && util->samples > 0 ? util->avg_util() : -1) << "</td><td class=\"n\">"
           << (lease->telemetry.memory_used_gib >= 0 ? fixed_text(lease->telemetry.memory_used_gib, 1) : "&ndash;")
           << "</td><td>";
      // NVML's figures: the process's own where the trainer sends it (on a shared GPU the device's is everyone's)
      const std::string on_gpu =
          device_memory_text(lease->telemetry.process_memory_used_gib, lease->telemetry.device_memory_used_gib);
      html << (on_gpu.empty() ? "&ndash;" : on_gpu) << "</td></tr>\n";
    }
    html << "</table></div>\n";
  }

  html << "<h2>Queue</h2>\n";
  if (queued.empty()) {
    html << "<p class=\"empty\">Nobody is waiting.</p>\n";
  } else {
    html << "<div class=\"scroll\"><table "
            "id=\"queue\"><tr><th>#</th><th>lease</th><th>team</th><th>user</th><th>job</th><th>GPUs</th>"
         << "<th>priority</th><th>waiting for</th><th>why</th></tr>\n";
    for (const Lease* lease : queued) {
      const AcquireResult status = engine.status_of(lease->id, now_ms);
      html << "<tr><td class=\"n\">" << status.position << "</td><td class=\"n\">" << lease->id << "</td><td>"
           << html_escape(lease->req.team) << "</td><td>" << html_escape(lease->req.user) << "</td><td>"
           << html_escape(lease->req.job) << "</td><td class=\"n\">" << lease->gpus << "</td><td>"
           << to_string(lease->req.priority) << "</td><td class=\"n\">"
           << format_duration_ms(now_ms - lease->created_ms) << "</td><td>" << html_escape(status.reason)
           << "</td></tr>\n";
    }
    html << "</table></div>\n";
  }

  html << "<h2>Waste list</h2>\n<div class=\"sub\">Running leases below "
       << fixed_text(100 * policy.waste_gpu_util_below, 0) << " % GPU utilisation for at least "
       << format_duration_ms(static_cast<int64_t>(policy.waste_after_s) * 1000) << ".</div>\n";
  if (waste.empty()) {
    html << "<p class=\"empty\">No idle lease.</p>\n";
  } else {
    html << "<div class=\"scroll\"><table id=\"waste\" "
            "class=\"waste\"><tr><th>lease</th><th>team</th><th>user</th><th>job</th>"
         << "<th>GPUs</th><th>below threshold for</th><th>utilisation now</th><th>idle GPU-hours</th></tr>\n";
    for (const auto& entry : waste) {
      html << "<tr><td class=\"n\">" << entry.lease_id << "</td><td>" << html_escape(entry.team) << "</td><td>"
           << html_escape(entry.user) << "</td><td>" << html_escape(entry.job) << "</td><td class=\"n\">"
           << fixed_text(entry.units, 0) << "</td><td class=\"n\">" << format_duration_ms(entry.low_ms)
           << "</td><td class=\"n\">" << percent(entry.last_util) << "</td><td class=\"n\">"
           << fixed_text(entry.wasted_gpu_hours, 1) << "</td></tr>\n";
    }
    html << "</table></div>\n";
  }
  html << "<p class=\"sub\">Live figures: <a href=\"/metrics\">/metrics</a> (Prometheus).</p>\n</body></html>\n";
  return html.str();
}

std::string favicon_ico() {
  // 16x16, 32-bit BGRA, bottom-up rows, then a 1-bit AND mask (all zero: alpha decides); a blue tile with three
  // white bars, like the page's usage bars
  constexpr int kSize = 16;
  std::string ico;
  auto u16 = [&](unsigned value) {
    ico += static_cast<char>(value & 0xff);
    ico += static_cast<char>((value >> 8) & 0xff);
  };
  auto u32 = [&](uint32_t value) {
    u16(value & 0xffff);
    u16(value >> 16);
  };
  const uint32_t pixels_bytes = kSize * kSize * 4, mask_bytes = kSize * 4;  // mask rows padded to 32 bits
  const uint32_t image_bytes = 40 + pixels_bytes + mask_bytes;
  u16(0), u16(1), u16(1);  // ICONDIR: reserved, type icon, one image
  ico += static_cast<char>(kSize), ico += static_cast<char>(kSize), ico += '\0', ico += '\0';
  u16(1), u16(32), u32(image_bytes), u32(6 + 16);        // planes, bits, size, offset
  u32(40), u32(kSize), u32(2 * kSize), u16(1), u16(32);  // BITMAPINFOHEADER (height counts the mask)
  u32(0), u32(pixels_bytes + mask_bytes), u32(0), u32(0), u32(0), u32(0);
  const int bar_top[3] = {9, 4, 6};  // rows from the top where each bar starts (columns 3-4, 7-8, 11-12)
  for (int row = kSize - 1; row >= 0; --row) {
    for (int column = 0; column < kSize; ++column) {
      const bool corner = (row == 0 || row == kSize - 1) && (column == 0 || column == kSize - 1);
      const int bar = (column - 3) / 4;
      const bool white = column >= 3 && column <= 12 && (column - 3) % 4 < 2 && row >= bar_top[bar] && row <= 12;
      const uint32_t bgra = corner ? 0x00000000u : white ? 0xffffffffu : 0xffd87d3bu;  // #3b7dd8
      u32(bgra);
    }
  }
  ico.append(mask_bytes, '\0');
  return ico;
}

std::string render_status_page(QuotaService& service) {
  std::string html;
  service.observe(
      [&](const ServiceView& view) { html = render_status_page(view.policy, view.engine, view.tracker, view.now_ms); });
  return html;
}

}  // namespace yolo8::quota
