"""Prints the cores this process may use, by the rule of our trainer's threads=0 (trainer/runtime/cpu_share.cpp): the
CPU affinity, capped by the smallest cgroup quota (v2 cpu.max of the process's cgroup and every parent, v1
cpu.cfs_quota_us) rounded down, at least 1; divided among LOCAL_WORLD_SIZE ranks when that is set."""
import os
from pathlib import Path


def quota(root=Path("/sys/fs/cgroup")):
    found = []
    rel = "/"
    for line in Path("/proc/self/cgroup").read_text().splitlines() if Path("/proc/self/cgroup").exists() else []:
        if line.startswith("0::"):
            rel = line[3:] or "/"
    d = Path(rel.lstrip("/"))
    while True:
        try:
            q, p = (root / d / "cpu.max").read_text().split()[:2]
            if q != "max" and float(p) > 0 and float(q) > 0:
                found.append(float(q) / float(p))
        except (OSError, ValueError):
            pass
        if d == Path("."):
            break
        d = d.parent
    for controller in ("cpu", "cpu,cpuacct"):
        try:
            q = float((root / controller / "cpu.cfs_quota_us").read_text())
            p = float((root / controller / "cpu.cfs_period_us").read_text())
            if q > 0 and p > 0:
                found.append(q / p)
        except (OSError, ValueError):
            pass
    return min(found) if found else 0.0


cores = len(os.sched_getaffinity(0))
q = quota()
if q > 0:
    cores = min(cores, max(1, int(q)))
ranks = os.environ.get("LOCAL_WORLD_SIZE", "")
if ranks.isdigit() and int(ranks) > 1:
    cores = max(1, cores // int(ranks))
print(cores)
