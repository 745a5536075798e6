// quotad's transient answers, end to end: real `yolo8 train` processes on CPU against a real quotad (or none).
// A storage stall (quotad's 503 with Retry-After) while a pod asks for its lease is waited out; a quotad that is
// down at start ends the run with exit 75 at the start-up deadline (quota_retry_s), never 1 or 2; a SIGTERM while
// waiting exits 75 at once; a stopped quotad (SIGSTOP: it accepts connections and answers nothing) leaves the
// steps going, and the run checkpoints and exits 75 within ttl - interval of its last heartbeat, saying that its
// release was not acknowledged; a run whose quotad leader is killed goes on with the replica that takes over. And
// stdout reaches a pipe (kubectl logs) line by line.
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "common/exit_codes.h"
#include "data/synth.h"
#include "tests/quota/client/fake_quotad.h"
#include "tests/quota/postgres_cluster.h"
#include "tests/quota/quotad_process.h"
#include "tests/quota/write_lock_holder.h"
#include "tests/trainer/process_util.h"
#include "trainer/core/checkpoint.h"

namespace yolo8 {
namespace {
using quota::testing::closed_port_url;
using yolo8::test::WriteLockHolder;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using test::read_text;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// ttl 12 s, a heartbeat every second: a run must be gone 11 s after its last acknowledged heartbeat.
constexpr int kTtlS = 12;
constexpr int kHeartbeatS = 1;
const std::string kPolicy = test::one_gpu_policy(kTtlS, kHeartbeatS);

fs::path fresh_root(const std::string& name) {
  const fs::path root = fs::path(::testing::TempDir()) / ("yolo8_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(root);
  fs::create_directories(root);
  data::synthesize_dataset((root / "ds").string(), 16, 4, 64, 11);
  return root;
}

std::vector<std::string> train_args(const fs::path& root, const std::string& quota, int epochs,
                                    const std::vector<std::string>& extra = {}) {
  std::vector<std::string> args = {"train",
                                   "data=" + (root / "ds" / "data.yaml").string(),
                                   "model=yolov8n.yaml",
                                   "imgsz=64",
                                   "batch=4",
                                   "epochs=" + std::to_string(epochs),
                                   "workers=1",
                                   "threads=1",
                                   "device=cpu",
                                   "val=false",
                                   "plots=false",
                                   "quota=" + quota,
                                   "team=ta",
                                   "user=alice",
                                   "project=" + (root / "runs").string(),
                                   "name=run"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

struct Ended {
  int exit_code = -1;  // -1: killed at the limit
  double seconds = 0;  // from `since`
};

// Waits for the child's exit until `limit_s` after `since` (then SIGKILL: the test fails instead of hanging).
Ended wait_exit(pid_t child, Clock::time_point since, double limit_s) {
  int status = 0;
  for (;;) {
    if (waitpid(child, &status, WNOHANG) == child) return Ended{test::exit_code_of(status), seconds_since(since)};
    if (seconds_since(since) > limit_s) {
      kill(child, SIGKILL);
      waitpid(child, &status, 0);
      return Ended{-1, seconds_since(since)};
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

// Waits until the log holds `text` (false at `limit_s`, or when the child exited first).
bool wait_for_text(pid_t child, const fs::path& log, const std::string& text, double limit_s) {
  for (const auto start = Clock::now(); seconds_since(start) < limit_s;) {
    if (read_text(log).find(text) != std::string::npos) return true;
    int status = 0;
    if (waitpid(child, &status, WNOHANG) == child) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

// The progress lines of the run's steps ("12/1000 box ... 2/4 [...]") in `text`.
int step_lines(const std::string& text) {
  static const std::regex kStep(R"(\n\d+/\d+ box )");
  return static_cast<int>(std::distance(std::sregex_iterator(text.begin(), text.end(), kStep), std::sregex_iterator()));
}

// Before: quotad's 503 (its documented "retry") was a refusal, exit 2, and the Job's FailJob rule ended the Job.
TEST(LeaseOutage, AStorageStallWhileAskingIsWaitedOutAndTheRunCompletes) {
  const fs::path root = fresh_root("outage_stall");
  test::QuotadProcess quotad;
  ASSERT_TRUE(quotad.start_in(root, kPolicy)) << read_text(root / "quotad.log");
  auto lock = std::make_unique<WriteLockHolder>((root / "quota.db").string());
  const fs::path log = root / "train.log";
  const pid_t child =
      test::spawn_yolo8(train_args(root, quotad.url(), 1), {{"YOLO8_QUOTA_TOKEN", "alice-token"}}, log.string());
  // quotad waits 2 s for the lock, then answers 503 with Retry-After: 2
  ASSERT_TRUE(wait_for_text(child, log, "quotad unavailable (503: storage: ", 60)) << read_text(log);
  std::this_thread::sleep_for(std::chrono::seconds(2));
  lock.reset();  // the stall ends
  const Ended ended = wait_exit(child, Clock::now(), 180);
  const std::string out = read_text(log);
  EXPECT_EQ(ended.exit_code, kExitCompleted) << out;
  EXPECT_TRUE(std::regex_search(out, std::regex(R"(  quotad unavailable \(503: storage: [^\n]*\): retrying in \d+ s, )"
                                                R"(giving up in \d+ s\n)")))
      << out;
  EXPECT_NE(out.find("Lease 1 granted"), std::string::npos) << out;
  EXPECT_NE(out.find("Lease 1 released (completed)"), std::string::npos) << out;
  EXPECT_TRUE(quotad.stop());
  fs::remove_all(root);
}

// Before: a pod started while quotad was down exited 1 after 60 s, which the Job counts against backoffLimit.
TEST(LeaseOutage, AQuotadThatIsDownEndsTheRunWithExit75AtTheStartUpDeadline) {
  const fs::path root = fresh_root("outage_down");
  const fs::path log = root / "train.log";
  const auto start = Clock::now();
  const pid_t child = test::spawn_yolo8(train_args(root, closed_port_url(), 1, {"quota_retry_s=4"}),
                                        {{"YOLO8_QUOTA_TOKEN", "x"}}, log.string());
  ASSERT_TRUE(wait_for_text(child, log, "quotad unavailable", 60)) << read_text(log);
  const auto asking = Clock::now();
  const Ended ended = wait_exit(child, start, 120);
  const std::string out = read_text(log);
  std::cout << "exit " << ended.exit_code << " " << seconds_since(asking) << " s after the first retry line\n";
  EXPECT_EQ(ended.exit_code, kExitPreempted) << out;
  EXPECT_LT(seconds_since(asking), 4 + 3.0) << out;
  EXPECT_TRUE(std::regex_search(
      out, std::regex(R"(  quotad unavailable \(no answer: Connection\): retrying in \d+ s, giving up in \d+ s\n)")))
      << out;
  EXPECT_NE(out.find("Stopped (quota service unreachable) before training: quotad unavailable for 4 s, the last of "),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("(quota_retry_s=4)"), std::string::npos) << out;
  EXPECT_EQ(out.find("Training yolov8n"), std::string::npos) << out;
  fs::remove_all(root);
}

// The README's promise before training begins: the first SIGTERM exits 75 at once, waiting for quotad included.
TEST(LeaseOutage, SigtermWhileQuotadIsUnavailableExits75AtOnce) {
  const fs::path root = fresh_root("outage_sigterm");
  const fs::path log = root / "train.log";
  const pid_t child =
      test::spawn_yolo8(train_args(root, closed_port_url(), 1), {{"YOLO8_QUOTA_TOKEN", "x"}}, log.string());
  ASSERT_TRUE(wait_for_text(child, log, "quotad unavailable", 60)) << read_text(log);
  const auto signalled = Clock::now();
  kill(child, SIGTERM);
  const Ended ended = wait_exit(child, signalled, 20);
  const std::string out = read_text(log);
  std::cout << "exit " << ended.exit_code << " " << ended.seconds << " s after SIGTERM while quotad was down\n";
  EXPECT_EQ(ended.exit_code, kExitPreempted) << out;
  EXPECT_LT(ended.seconds, 1.0) << out;
  EXPECT_NE(out.find("Stopped (signal) before training: stopped while waiting for a GPU lease"), std::string::npos)
      << out;
  fs::remove_all(root);
}

// Before: the steps went on, but the exit waited about 22 s on the stopped quotad (the heartbeat in flight, a last
// heartbeat, three release attempts of 5 s each), 33 s after the SIGSTOP against a bound of 11, and printed
// "Lease 1 released" though nothing answered.
TEST(LeaseOutage, AStoppedQuotadLeavesTheStepsGoingAndTheRunExits75WithinTheTtl) {
  const fs::path root = fresh_root("outage_sigstop");
  test::QuotadProcess quotad;
  ASSERT_TRUE(quotad.start_in(root, kPolicy)) << read_text(root / "quotad.log");
  const fs::path log = root / "train.log";
  const pid_t child =
      test::spawn_yolo8(train_args(root, quotad.url(), 1000), {{"YOLO8_QUOTA_TOKEN", "alice-token"}}, log.string());
  // steps run, with their heartbeats answered
  for (const auto until = Clock::now() + std::chrono::seconds(120);
       step_lines(read_text(log)) < 8 && Clock::now() < until;) {
    int status = 0;
    ASSERT_NE(waitpid(child, &status, WNOHANG), child) << read_text(log);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_GE(step_lines(read_text(log)), 8) << read_text(log);
  ASSERT_EQ(kill(quotad.pid(), SIGSTOP), 0);
  const auto stopped = Clock::now();
  const int steps_before = step_lines(read_text(log));
  const Ended ended = wait_exit(child, stopped, 60);
  kill(quotad.pid(), SIGCONT);
  const std::string out = read_text(log);
  const auto stop_line = out.find("Stopped (quota service unreachable) ");  // in the epoch or at its end
  ASSERT_NE(stop_line, std::string::npos) << out;
  const int steps_while_stopped = step_lines(out.substr(0, stop_line)) - steps_before;
  std::cout << steps_while_stopped << " steps while quotad was stopped; exit " << ended.exit_code << " "
            << ended.seconds << " s after the SIGSTOP (the lease's ttl " << kTtlS << " s, heartbeat every "
            << kHeartbeatS << " s)\n";
  EXPECT_EQ(ended.exit_code, kExitPreempted) << out;
  // The last acknowledged heartbeat came at most an interval before the SIGSTOP: gone within ttl - interval of it.
  EXPECT_LT(ended.seconds, kTtlS - 2 * kHeartbeatS) << out;
  // The fence comes ttl - interval - 5 s after the last heartbeat (6 s here): steps all along until then.
  EXPECT_GE(steps_while_stopped, 5) << out;
  EXPECT_TRUE(checkpoint_readable((root / "runs" / "run" / "weights" / "last.pt").string())) << out;
  EXPECT_EQ(out.find("Lease 1 released"), std::string::npos) << out;
  EXPECT_TRUE(std::regex_search(
      out, std::regex(R"(Lease 1 release not acknowledged \(no answer: Read\): quotad expires it 12 s after its last )"
                      R"(acknowledged heartbeat, at \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC; the next run here releases it )"
                      R"(\(.*/runs/run/quota_lease\.json\)\n)")))
      << out;
  // the record the next run in the folder releases the lease from
  const std::string record = read_text(root / "runs" / "run" / "quota_lease.json");
  EXPECT_NE(record.find(R"("lease_id":1)"), std::string::npos) << record;
  EXPECT_NE(record.find(R"("outcome":"preempted")"), std::string::npos) << record;
  EXPECT_TRUE(quotad.stop());
  fs::remove_all(root);
}

// Two quotad replicas on one PostgreSQL database: the leader is killed (kill -9) while the run trains. The run's
// heartbeats go on to the replica that took over (the next of its quota URLs), the lease is kept, and the run
// completes, its release acknowledged there.
TEST(LeaseFailover, ATrainerHeartbeatingThroughALeaderKillKeepsItsLeaseAndCompletes) {
  const fs::path root = fresh_root("failover");
  std::ofstream(root / "policy.yaml") << kPolicy;
  const std::string url = quota::testing::PostgresCluster::get().fresh_database("trainer_failover");
  test::QuotadProcess leader;
  ASSERT_TRUE(leader.start((root / "policy.yaml").string(), url, (root / "leader.log").string()))
      << read_text(root / "leader.log");
  test::QuotadProcess follower;
  ASSERT_TRUE(follower.start((root / "policy.yaml").string(), url, (root / "follower.log").string()))
      << read_text(root / "follower.log");
  const fs::path log = root / "train.log";
  const pid_t child = test::spawn_yolo8(train_args(root, leader.url() + "," + follower.url(), 30),
                                        {{"YOLO8_QUOTA_TOKEN", "alice-token"}}, log.string());
  for (const auto until = Clock::now() + std::chrono::seconds(120);
       step_lines(read_text(log)) < 6 && Clock::now() < until;) {
    int status = 0;
    ASSERT_NE(waitpid(child, &status, WNOHANG), child) << read_text(log);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_GE(step_lines(read_text(log)), 6) << read_text(log);
  leader.kill_hard();
  const int steps_before = step_lines(read_text(log));
  const Ended ended = wait_exit(child, Clock::now(), 300);
  const std::string out = read_text(log);
  std::cout << step_lines(out) - steps_before << " steps after the leader was killed; exit " << ended.exit_code << " "
            << ended.seconds << " s after the kill\n";
  EXPECT_EQ(ended.exit_code, kExitCompleted) << out << read_text(root / "follower.log");
  EXPECT_GT(step_lines(out), steps_before) << out;
  // several heartbeats after the kill, each answered by the replica that took over
  EXPECT_GT(ended.seconds, 3 * kHeartbeatS) << out;
  EXPECT_NE(out.find("Lease 1 released (completed)"), std::string::npos) << out;
  EXPECT_EQ(out.find("Stopped (quota service"), std::string::npos) << out;
  EXPECT_NE(read_text(root / "follower.log").find("this replica leads"), std::string::npos)
      << read_text(root / "follower.log");
  EXPECT_TRUE(follower.stop());
  fs::remove_all(root);
}

// Under a pipe (kubectl logs) each line shows as it is written: before, stdout was block-buffered there and the
// first lines came a minute later, when the run exited.
TEST(StartupOutput, StdoutOnAPipeShowsEachLineWhileTheRunGoesOn) {
  const fs::path root = fresh_root("outage_pipe");
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const std::string binary = std::string(test::kBinaryDir) + "/trainer/yolo8";
  const std::vector<std::string> args = train_args(root, closed_port_url(), 1);
  const pid_t child = fork();
  if (child == 0) {
    dup2(fds[1], 1);
    ::close(fds[0]);
    ::close(fds[1]);
    std::vector<char*> argv{const_cast<char*>(binary.c_str())};
    for (const auto& arg : args) argv.push_back(const_cast<char*>(arg.c_str()));
    argv.push_back(nullptr);
    execv(binary.c_str(), argv.data());
    _exit(127);
  }
  ::close(fds[1]);
  std::string seen;
  bool asking = false;
  for (const auto start = Clock::now(); !asking && seconds_since(start) < 30;) {
    pollfd readable{fds[0], POLLIN, 0};
    if (::poll(&readable, 1, 100) > 0) {
      char buffer[4096];
      const ssize_t n = ::read(fds[0], buffer, sizeof(buffer));
      if (n <= 0) break;
      seen.append(buffer, static_cast<size_t>(n));
    }
    asking = seen.find("Asking http://127.0.0.1:") != std::string::npos;
  }
  int status = 0;
  const bool running = waitpid(child, &status, WNOHANG) != child;
  kill(child, SIGTERM);
  const Ended ended = wait_exit(child, Clock::now(), 20);
  ::close(fds[0]);
  EXPECT_TRUE(asking) << "nothing of the lease request on the pipe within 30 s: " << seen;
  EXPECT_TRUE(running) << seen;
  EXPECT_EQ(ended.exit_code, kExitPreempted) << seen;
  fs::remove_all(root);
}

}  // namespace
}  // namespace yolo8
