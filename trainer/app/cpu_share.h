#pragma once
// How many cores this process may really use: the host's count is the wrong answer in a pod limited to 8 CPUs on
// a 128-core node (128 compute threads throttled by the cgroup). The share is the smaller of the CPU affinity
// (taskset, cpuset) and the cgroup's CPU quota (v2 cpu.max, v1 cfs_quota_us / cfs_period_us).

#include <string>

namespace yolo8 {

struct CpuShare {
  int host_cores = 1;        // std::thread::hardware_concurrency()
  int affinity_cores = 1;    // CPUs this process may run on (sched_getaffinity)
  double quota_cores = 0;    // cgroup quota in cores; 0: none
  std::string quota_source;  // the file that set it, "" when none
  int cores = 1;             // what threads=0 and the loader use: min(affinity, floor(quota)), at least 1

  bool shared() const { return cores < host_cores; }
  // One line for the run log: what was chosen and why.
  std::string explain() const;
};

// Reads the quota under `cgroup_root` (production: /sys/fs/cgroup) for the cgroup `cgroup_path` ("/" or the path
// of /proc/self/cgroup; every level up to the root is read, the smallest quota wins); a missing or unreadable
// file means no quota. `host_cores` and `affinity_cores` are given so that a test controls them.
CpuShare cpu_share_from(const std::string& cgroup_root, const std::string& cgroup_path, int host_cores,
                        int affinity_cores);

// This process's share: /sys/fs/cgroup, /proc/self/cgroup, sched_getaffinity.
CpuShare current_cpu_share();

}  // namespace yolo8
