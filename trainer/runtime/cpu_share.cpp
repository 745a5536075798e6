#include "trainer/runtime/cpu_share.h"

#include <sched.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace yolo8 {
namespace fs = std::filesystem;

namespace {

// v2 cpu.max: "max 100000" (no limit) or "<quota> <period>" in microseconds. 0 when there is no limit.
double read_cpu_max(const fs::path& file) {
  std::ifstream in(file);
  std::string quota;
  double period = 0;
  if (!(in >> quota >> period) || quota == "max" || period <= 0) return 0;
  try {
    const double value = std::stod(quota);
    return value > 0 ? value / period : 0;
  } catch (const std::exception&) {
    return 0;  // a file we do not understand limits nothing
  }
}

// v1: cpu.cfs_quota_us (-1: no limit) over cpu.cfs_period_us.
double read_cfs_quota(const fs::path& dir) {
  std::ifstream quota_in(dir / "cpu.cfs_quota_us");
  std::ifstream period_in(dir / "cpu.cfs_period_us");
  double quota = 0, period = 0;
  if (!(quota_in >> quota) || !(period_in >> period) || quota <= 0 || period <= 0) return 0;
  return quota / period;
}

// The cgroup v2 path of this process, from "0::/kubepods/..." in /proc/self/cgroup; "/" when not found.
std::string own_cgroup_path() {
  std::ifstream in("/proc/self/cgroup");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("0::", 0) == 0) return line.substr(3).empty() ? "/" : line.substr(3);
  }
  return "/";
}

int affinity_core_count(int host_cores) {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return host_cores;
  return std::max(1, CPU_COUNT(&set));
}

}  // namespace

std::string CpuShare::explain() const {
  std::ostringstream out;
  out << cores << " of " << host_cores << " cores";
  if (affinity_cores < host_cores) out << "; affinity allows " << affinity_cores;
  if (quota_cores > 0) {
    char quota[32];
    std::snprintf(quota, sizeof(quota), "%.2f", quota_cores);
    out << "; cgroup quota " << quota << " cores (" << quota_source << ")";
  }
  if (affinity_cores >= host_cores && quota_cores <= 0) out << "; no affinity or quota limit";
  if (local_ranks > 1) {
    out << "; split among the " << local_ranks << " ranks on this node (LOCAL_WORLD_SIZE): " << cores << " each";
  }
  return out.str();
}

CpuShare cpu_share_from(const std::string& cgroup_root, const std::string& cgroup_path, int host_cores,
                        int affinity_cores) {
  CpuShare share;
  share.host_cores = std::max(1, host_cores);
  share.affinity_cores = std::clamp(affinity_cores, 1, share.host_cores);
  const fs::path root(cgroup_root);
  const auto consider = [&](double quota, const fs::path& file) {
    if (quota > 0 && (share.quota_cores == 0 || quota < share.quota_cores)) {
      share.quota_cores = quota;
      share.quota_source = file.string();
    }
  };
  // v2: the process's own cgroup and each parent (a limit on the pod's cgroup binds its containers).
  fs::path relative = fs::path(cgroup_path).relative_path();
  for (;;) {
    const fs::path dir = root / relative;
    consider(read_cpu_max(dir / "cpu.max"), dir / "cpu.max");
    if (relative.empty()) break;
    relative = relative.parent_path();
  }
  // v1 (a quota-limited container sees its own cgroup at the mount's root).
  for (const char* controller : {"cpu", "cpu,cpuacct"}) {
    consider(read_cfs_quota(root / controller), root / controller / "cpu.cfs_quota_us");
  }
  share.cores = share.affinity_cores;
  // floor: 2.5 cores of quota run 2 busy threads without throttling; 3 would be throttled every period.
  if (share.quota_cores > 0) share.cores = std::min(share.cores, std::max(1, static_cast<int>(share.quota_cores)));
  return share;
}

CpuShare divide_among_local_ranks(CpuShare share, int local_ranks) {
  share.local_ranks = std::max(1, local_ranks);
  share.cores = std::max(1, share.cores / share.local_ranks);
  return share;
}

int local_ranks_from(const char* value) {
  if (value == nullptr || *value == '\0') return 1;
  const std::string text(value);
  if (text.size() > 7 || !std::all_of(text.begin(), text.end(), [](unsigned char c) { return std::isdigit(c); }) ||
      std::stoi(text) < 1) {
    throw std::invalid_argument("environment variable LOCAL_WORLD_SIZE must be a whole number from 1 up, got '" + text +
                                "'");
  }
  return std::stoi(text);
}

CpuShare current_cpu_share() {
  const int host = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return divide_among_local_ranks(cpu_share_from("/sys/fs/cgroup", own_cgroup_path(), host, affinity_core_count(host)),
                                  local_ranks_from(std::getenv("LOCAL_WORLD_SIZE")));
}

}  // namespace yolo8
