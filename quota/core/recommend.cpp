#include "quota/core/recommend.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <regex>
#include <sstream>

#include "quota/core/api.h"

namespace yolo8::quota {

namespace {

constexpr double kEps = 1e-9;

std::string number(double value) {
  return value == std::floor(value) ? std::to_string(static_cast<long long>(value)) : fixed_text(value, 2);
}

std::string duration(double seconds) {
  if (seconds < 120) return fixed_text(seconds, 0) + " s";
  if (seconds < 7200) return fixed_text(seconds / 60, 0) + " min";
  return fixed_text(seconds / 3600, 1) + " h";
}

// Time-weighted percentile: the smallest value held for at least `share` of the total time (nearest rank).
double weighted_percentile(std::vector<std::pair<double, int64_t>> segments, double share) {
  int64_t total = 0;
  for (const auto& segment : segments) total += segment.second;
  if (total <= 0) return 0;
  std::sort(segments.begin(), segments.end());
  const double target = share * static_cast<double>(total);
  int64_t cumulative = 0;
  for (const auto& [value, ms] : segments) {
    cumulative += ms;
    if (static_cast<double>(cumulative) + kEps >= target) return value;
  }
  return segments.back().first;
}

double percentile(std::vector<double> values, double share) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t rank = static_cast<size_t>(std::ceil(share * static_cast<double>(values.size())));
  return values[std::min(values.size(), std::max<size_t>(rank, 1)) - 1];
}

// Step functions of GPUs held and GPUs held + waiting, as (value, duration) segments over the active time.
struct Profile {
  std::vector<std::pair<double, int64_t>> in_use, demand;
  int64_t active_ms = 0;
  double peak_in_use = 0, peak_demand = 0;
};

Profile profile(const std::vector<const HistoryLease*>& leases, int64_t from, int64_t to) {
  std::map<int64_t, std::pair<double, double>> delta;  // time -> (held change, demand change)
  for (const HistoryLease* lease : leases) {
    const int64_t wait_end = lease->granted_ms > 0 ? lease->granted_ms : lease->end_ms;
    const int64_t wait_from = std::max(lease->created_ms, from), wait_to = std::min(wait_end, to);
    if (wait_to > wait_from) {
      delta[wait_from].second += lease->units;
      delta[wait_to].second -= lease->units;
    }
    if (lease->granted_ms > 0) {
      const int64_t held_from = std::max(lease->granted_ms, from), held_to = std::min(lease->end_ms, to);
      if (held_to > held_from) {
        delta[held_from].first += lease->units;
        delta[held_to].first -= lease->units;
        delta[held_from].second += lease->units;
        delta[held_to].second -= lease->units;
      }
    }
  }
  Profile out;
  double held = 0, demand = 0;
  int64_t last = from;
  for (const auto& [time, change] : delta) {
    if (time > last && demand > kEps) {
      out.in_use.emplace_back(held, time - last);
      out.demand.emplace_back(demand, time - last);
      out.active_ms += time - last;
    }
    held += change.first;
    demand += change.second;
    if (std::fabs(held) < kEps) held = 0;
    if (std::fabs(demand) < kEps) demand = 0;
    out.peak_in_use = std::max(out.peak_in_use, held);
    out.peak_demand = std::max(out.peak_demand, demand);
    last = time;
  }
  return out;
}

}  // namespace

Recommendation recommend(const Policy& policy, const UsageHistory& history) {
  Recommendation out;
  out.from_ms = history.from_ms;
  out.to_ms = history.to_ms;
  out.capacity = policy.total_gpus() - policy.emergency_pool_gpus();
  const double capacity = out.capacity;
  const int64_t window = std::max<int64_t>(1, history.to_ms - history.from_ms);
  for (const auto& [name, team] : policy.teams) {
    TeamRecommendation rec;
    rec.team = name;
    rec.current_base = team.base;
    rec.current_burst = team.burst;
    std::vector<const HistoryLease*> leases;
    std::vector<double> waits;
    for (const auto& lease : history.leases) {
      if (lease.team != name || lease.emergency) continue;
      leases.push_back(&lease);
      if (lease.granted_ms > 0) {
        const int64_t held_from = std::max(lease.granted_ms, history.from_ms);
        const int64_t held_to = std::min(lease.end_ms, history.to_ms);
        if (held_to > held_from) rec.gpu_hours += lease.units * static_cast<double>(held_to - held_from) / 3.6e6;
        if (lease.created_ms >= history.from_ms && lease.granted_ms < history.to_ms) {
          waits.push_back(static_cast<double>(lease.granted_ms - lease.created_ms) / 1000.0);
        }
      }
      rec.sampled_gpu_hours += lease.sampled_gpu_hours;
      rec.idle_gpu_hours += lease.idle_gpu_hours;
    }
    const Profile shape = profile(leases, history.from_ms, history.to_ms);
    rec.has_history = shape.active_ms > 0;
    if (!rec.has_history) {
      rec.base = team.base;
      rec.burst = team.burst;
      rec.why.push_back("no GPUs held or requested in the window: base and burst stay as they are");
      out.teams.push_back(rec);
      continue;
    }
    rec.active_share = static_cast<double>(shape.active_ms) / static_cast<double>(window);
    rec.p50_in_use = weighted_percentile(shape.in_use, 0.50);
    rec.p95_in_use = weighted_percentile(shape.in_use, 0.95);
    rec.peak_in_use = shape.peak_in_use;
    rec.p95_demand = weighted_percentile(shape.demand, 0.95);
    rec.peak_demand = shape.peak_demand;
    rec.idle_share = rec.sampled_gpu_hours > kEps ? rec.idle_gpu_hours / rec.sampled_gpu_hours : 0;
    rec.granted_leases = static_cast<int>(waits.size());
    rec.p50_wait_s = percentile(waits, 0.50);
    rec.p95_wait_s = percentile(waits, 0.95);
    const double busy = 1 - rec.idle_share;
    rec.base = std::min(capacity, std::ceil(rec.p50_in_use * busy - kEps));
    rec.why.push_back("base = ceil(p50 in use " + fixed_text(rec.p50_in_use) + " x busy share " + fixed_text(busy, 3) +
                      ") = " + number(rec.base) +
                      (rec.idle_share > 0 ? " (idle GPUs are no case for a larger guarantee)" : ""));
    rec.burst = std::min(capacity, std::max(rec.base, std::ceil(rec.p95_demand - kEps)));
    rec.why.push_back("burst = max(base, ceil(p95 in use + waiting " + fixed_text(rec.p95_demand) +
                      ")) = " + number(rec.burst) +
                      (rec.p95_demand > rec.p95_in_use + kEps
                           ? " (requests waited in the queue: p95 wait " + duration(rec.p95_wait_s) + ")"
                           : ""));
    out.teams.push_back(rec);
  }
  // the bases are guarantees: together they must fit outside the emergency pool
  double sum = 0;
  for (const auto& rec : out.teams) sum += rec.base;
  if (sum > capacity + kEps) {
    std::vector<std::pair<double, size_t>> remainders;
    double given = 0;
    for (size_t i = 0; i < out.teams.size(); ++i) {
      const double exact = out.teams[i].base * capacity / sum;
      const double floor = std::floor(exact + kEps);
      remainders.emplace_back(exact - floor, i);
      out.teams[i].why.push_back("bases sum to " + number(sum) + " > " + number(capacity) +
                                 " GPUs outside the emergency pool: scaled to " + fixed_text(exact, 2));
      out.teams[i].base = floor;
      given += floor;
    }
    std::stable_sort(remainders.begin(), remainders.end(),
                     [](const auto& left, const auto& right) { return left.first > right.first; });
    for (size_t i = 0; i < remainders.size() && given + kEps < capacity; ++i, ++given) {
      out.teams[remainders[i].second].base += 1;
    }
    for (auto& rec : out.teams) rec.burst = std::max(rec.burst, rec.base);
    out.notes.push_back("the bases were scaled down to fit " + number(capacity) + " GPUs (largest remainder)");
  }
  return out;
}

std::string recommendation_text(const Recommendation& recommendation) {
  std::ostringstream out;
  const double days = static_cast<double>(recommendation.to_ms - recommendation.from_ms) / 86400000.0;
  out << "Quota recommendation from " << fixed_text(days, 1) << " days of history; " << recommendation.capacity
      << " GPUs outside the emergency pool.\n";
  for (const auto& note : recommendation.notes) out << "Note: " << note << ".\n";
  for (const auto& rec : recommendation.teams) {
    out << "\n"
        << rec.team << ": base " << number(rec.current_base) << " -> " << number(rec.base) << ", burst "
        << number(rec.current_burst) << " -> " << number(rec.burst) << "\n";
    if (rec.has_history) {
      out << "  active (GPUs held or requested) " << fixed_text(100 * rec.active_share) << " % of the window; "
          << fixed_text(rec.gpu_hours) << " GPU-hours held\n"
          << "  GPUs in use while active: p50 " << fixed_text(rec.p50_in_use) << ", p95 " << fixed_text(rec.p95_in_use)
          << ", peak " << fixed_text(rec.peak_in_use) << "\n"
          << "  GPUs in use + waiting: p95 " << fixed_text(rec.p95_demand) << ", peak " << fixed_text(rec.peak_demand)
          << "\n"
          << "  queue wait (request to grant) over " << rec.granted_leases << " lease(s): p50 "
          << duration(rec.p50_wait_s) << ", p95 " << duration(rec.p95_wait_s) << "\n"
          << "  idle: " << fixed_text(rec.idle_gpu_hours) << " of " << fixed_text(rec.sampled_gpu_hours)
          << " GPU-hours with utilisation samples were below the waste threshold (" << fixed_text(100 * rec.idle_share)
          << " %)\n";
    }
    for (const auto& line : rec.why) out << "  " << line << "\n";
  }
  return out.str();
}

namespace {

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::string line;
  std::istringstream stream(text);
  while (std::getline(stream, line)) lines.push_back(line);
  return lines;
}

// `key: <number>` on `line` with the number replaced; false when the line holds no such key.
bool replace_value(std::string& line, const std::string& key, const std::string& value) {
  const std::regex pattern("(^|[\\s{,])(" + key + ":\\s*)([-+0-9.eE]+)");
  std::smatch match;
  if (!std::regex_search(line, match, pattern)) return false;
  line = match.prefix().str() + match[1].str() + match[2].str() + value + match.suffix().str();
  return true;
}

}  // namespace

std::string policy_diff(const std::string& policy_text, const std::string& policy_path, const Policy& policy,
                        const Recommendation& recommendation) {
  const std::vector<std::string> old_lines = split_lines(policy_text);
  // per old line: its new text, whether it changed, and lines added after it
  std::vector<std::string> new_lines = old_lines;
  std::vector<bool> changed(old_lines.size(), false);
  std::vector<std::vector<std::string>> added(old_lines.size());
  auto line_of = [&](const std::string& key) {
    auto it = policy.key_lines.find(key);
    return it == policy.key_lines.end() ? 0 : it->second;
  };
  for (const auto& rec : recommendation.teams) {
    const bool new_base = std::fabs(rec.base - rec.current_base) > kEps;
    const bool new_burst = std::fabs(rec.burst - rec.current_burst) > kEps;
    if (!new_base && !new_burst) continue;
    const std::string prefix = "teams." + rec.team + ".";
    const int base_line = line_of(prefix + "base");
    const int burst_line = line_of(prefix + "burst");
    if (base_line <= 0 || static_cast<size_t>(base_line) > old_lines.size()) {
      throw PolicyError(policy_path + ": " + prefix + "base: not found in the file; edit it by hand");
    }
    const size_t base_index = static_cast<size_t>(base_line) - 1;
    if (new_base) {
      if (!replace_value(new_lines[base_index], "base", number(rec.base))) {
        throw PolicyError(policy_path + ":" + std::to_string(base_line) + ": " + prefix + "base: not a number here");
      }
      changed[base_index] = true;
    }
    if (burst_line > 0) {
      const size_t burst_index = static_cast<size_t>(burst_line) - 1;
      if (new_burst && !replace_value(new_lines[burst_index], "burst", number(rec.burst))) {
        throw PolicyError(policy_path + ":" + std::to_string(burst_line) + ": " + prefix + "burst: not a number here");
      }
      changed[burst_index] = changed[burst_index] || new_burst;
    } else if (std::fabs(rec.burst - rec.base) > kEps) {
      // no burst key (it defaulted to base): add one next to base, in the same style
      std::string& line = new_lines[base_index];
      if (line.find('{') != std::string::npos) {
        const std::regex pattern("((^|[\\s{,])base:\\s*[-+0-9.eE]+)");
        line = std::regex_replace(line, pattern, "$1, burst: " + number(rec.burst),
                                  std::regex_constants::format_first_only);
        changed[base_index] = true;
      } else {
        const std::string indent = line.substr(0, line.find_first_not_of(" "));
        added[base_index].push_back(indent + "burst: " + number(rec.burst));
      }
    }
  }
  // hunks: changed lines with 3 lines of context, merged when they touch
  constexpr size_t kContext = 3;
  std::ostringstream out;
  size_t index = 0;
  bool any = false;
  long offset = 0;  // new line numbers run ahead of the old ones by the lines added so far
  auto touched = [&](size_t i) { return changed[i] || !added[i].empty(); };
  while (index < old_lines.size()) {
    if (!touched(index)) {
      ++index;
      continue;
    }
    const size_t start = index >= kContext ? index - kContext : 0;
    size_t end = index;  // last changed line of the hunk
    for (size_t next = index + 1; next < old_lines.size() && next <= end + 2 * kContext + 1; ++next) {
      if (touched(next)) end = next;
    }
    const size_t stop = std::min(old_lines.size(), end + kContext + 1);
    std::ostringstream body;
    size_t old_count = 0, new_count = 0;
    for (size_t i = start; i < stop; ++i) {
      body << (changed[i] ? "-" : " ") << old_lines[i] << "\n";
      if (changed[i]) body << "+" << new_lines[i] << "\n";
      ++old_count;
      ++new_count;
      for (const auto& line : added[i]) {
        body << "+" << line << "\n";
        ++new_count;
      }
    }
    if (!any) out << "--- " << policy_path << "\n+++ " << policy_path << "\n";
    any = true;
    out << "@@ -" << start + 1 << "," << old_count << " +" << static_cast<long>(start) + 1 + offset << "," << new_count
        << " @@\n"
        << body.str();
    offset += static_cast<long>(new_count) - static_cast<long>(old_count);
    index = stop;
  }
  return out.str();
}

}  // namespace yolo8::quota
