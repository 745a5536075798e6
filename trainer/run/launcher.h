#pragma once
// `device=0,1` on one machine: one training process per GPU, started and supervised by this one.

#include <chrono>
#include <map>
#include <string>
#include <vector>

namespace yolo8 {

struct LaunchOptions {
  std::string executable;                        // empty: the current binary (/proc/self/exe)
  std::map<std::string, std::string> extra_env;  // set in every child besides the rank variables
  int master_port = 0;                           // 0: a free port on 127.0.0.1
  // After a child fails (exit code neither 0 nor 75), the others get SIGTERM, then SIGKILL after this.
  std::chrono::milliseconds failure_grace{std::chrono::seconds(30)};
  // 0: none. Otherwise every child is killed after this long and the result is a failure.
  std::chrono::milliseconds timeout{0};
};

// Starts one child per entry of `device_ids` running `args` (argv without argv[0]) with RANK=LOCAL_RANK=i,
// WORLD_SIZE=n, MASTER_ADDR=127.0.0.1 and MASTER_PORT set; a child picks its device as
// device_ids[LOCAL_RANK] (Settings::device_ids). SIGTERM/SIGINT received meanwhile are forwarded to the
// children (each runs in its own process group, so a terminal's Ctrl-C reaches them once). Waits for all and
// returns 0 when all completed, 75 when any was preempted and none failed, else the first failing exit code
// (128+signal for a child killed by a signal).
int launch_local_workers(const std::vector<int>& device_ids, const std::vector<std::string>& args,
                         const LaunchOptions& options = {});

// A TCP port on 127.0.0.1 that was free a moment ago.
int find_free_port();

}  // namespace yolo8
