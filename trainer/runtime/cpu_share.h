#pragma once
// How many cores this process may really use: the host's count is the wrong answer in a pod limited to 8 CPUs on
// a 128-core node (128 compute threads throttled by the cgroup). The share is the smaller of the CPU affinity
// (taskset, cpuset) and the cgroup's CPU quota (v2 cpu.max, v1 cfs_quota_us / cfs_period_us), divided among the
// job's ranks on this node (they share the pod's quota and affinity).

#include <string>

namespace yolo8 {

struct CpuShare {
  int host_cores = 1;        // std::thread::hardware_concurrency()
  int affinity_cores = 1;    // CPUs this process may run on (sched_getaffinity)
  double quota_cores = 0;    // cgroup quota in cores; 0: none
  std::string quota_source;  // the file that set it, "" when none
  int local_ranks = 1;       // processes of one data-parallel job on this node (LOCAL_WORLD_SIZE)
  // What threads=0 and the loader use: min(affinity, floor(quota)) / local_ranks, at least 1.
  int cores = 1;

  bool shared() const { return cores < host_cores; }
  // One line for the run log: what was chosen and why.
  std::string explain() const;
};

// Reads the quota under `cgroup_root` (production: /sys/fs/cgroup) for the cgroup `cgroup_path` ("/" or the path
// of /proc/self/cgroup; every level up to the root is read, the smallest quota wins); a missing or unreadable
// file means no quota. `host_cores` and `affinity_cores` are given so that a test controls them.
CpuShare cpu_share_from(const std::string& cgroup_root, const std::string& cgroup_path, int host_cores,
                        int affinity_cores);

// `share` split among `local_ranks` processes of one job on this node: each gets cores / local_ranks (at least 1),
// so that 4 ranks in a pod limited to 8 CPUs run 2 compute threads each, not 8 (32 threads throttled by the
// cgroup). A launcher that pins each rank to its own CPUs (affinity per rank) needs threads= set instead.
CpuShare divide_among_local_ranks(CpuShare share, int local_ranks);

// LOCAL_WORLD_SIZE as yolo8's launcher and torchrun set it (`value`, nullptr or "" when unset): the job's
// processes on this node; 1 when unset. Throws std::invalid_argument naming the variable when it is not a
// whole number from 1 up.
int local_ranks_from(const char* value);

// This process's share: /sys/fs/cgroup, /proc/self/cgroup, sched_getaffinity, LOCAL_WORLD_SIZE.
CpuShare current_cpu_share();

}  // namespace yolo8
