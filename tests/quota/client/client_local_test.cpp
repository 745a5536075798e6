#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <thread>

#include "quota/client/client.h"
#include "quota/store/store.h"
#include "tests/quota/quota_test_util.h"

namespace yolo8::quota {
namespace {

using testing::temp_db;

ClientConfig local_config(const std::string& db, int gpus) {
  ClientConfig c;
  c.mode = "local";
  c.local_db = db;
  c.local_gpus = gpus;
  c.local_gpu_memory_gib = 24;
  c.user = "me";
  c.poll_interval_s = 0.05;
  return c;
}

TEST(QuotaClientLocal, OffModeIsANoOp) {
  ClientConfig c;
  c.mode = "off";
  QuotaClient q(c);
  EXPECT_FALSE(q.enabled());
  EXPECT_EQ(q.acquire(LeaseRequest{}).id, 0);
  q.start_heartbeats();
  EXPECT_FALSE(q.unreachable_too_long());
  q.release(Outcome::kCompleted);
  ClientConfig bad;
  bad.mode = "ftp://x";
  EXPECT_THROW(QuotaClient{bad}, std::invalid_argument);
}

// The first heartbeat leaves before any step and the next an interval later: a run that ends in between still
// reports its figures (its peak memory teaches quotad's memory table) with the last heartbeat, sent on release.
TEST(QuotaClientLocal, ARunShorterThanAHeartbeatIntervalStillReportsItsPeak) {
  const std::string db = temp_db("local_short_run");
  QuotaClient q(local_config(db, 1));
  LeaseRequest req;
  req.model = "yolov8n";
  req.gpus = 1;
  ASSERT_GT(q.acquire(req).id, 0);
  std::atomic<double> peak_gib{0.0};
  q.start_heartbeats([&peak_gib] {
    Telemetry t;
    t.model = "yolov8n";
    t.imgsz = 64;
    t.batch = 16;
    t.amp = 0;
    t.device_name = "cpu";
    t.memory_used_gib = peak_gib.load();
    return t;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the first beat went out with no peak yet
  peak_gib = 0.75;                                              // the steps, well inside one interval
  q.release(Outcome::kCompleted);
  const auto observations = Store(db).memory_observations();
  ASSERT_EQ(observations.size(), 1u);
  EXPECT_DOUBLE_EQ(observations[0].peak_gib, 0.75);
  EXPECT_EQ(observations[0].batch, 16);
}

// One table of what a status means: "not now" is retried (a lease request until quota_retry_s, then exit 75),
// "no" is final (exit 2).
TEST(QuotaClientStatus, TransientAnswersAreRetriedAndRefusalsAreFinal) {
  for (const int status : {0, 429, 500, 502, 503, 504}) {
    EXPECT_EQ(answer_class(status), AnswerClass::kTransient) << status;
    EXPECT_TRUE(is_unavailable(status)) << status;
  }
  for (const int status : {400, 401, 403, 404, 405, 409, 413, 422, 501, 505}) {
    EXPECT_EQ(answer_class(status), AnswerClass::kRefused) << status;
    EXPECT_FALSE(is_unavailable(status)) << status;
  }
  for (const int status : {200, 201, 202, 204}) EXPECT_EQ(answer_class(status), AnswerClass::kAnswered) << status;
}

TEST(QuotaClientLocal, ConfigFromTheTrainerSetting) {
  EXPECT_EQ(client_config_from_setting("off").mode, "off");
  EXPECT_EQ(client_config_from_setting("local", 4).local_gpus, 4);
  const ClientConfig p = client_config_from_setting("local:/tmp/x.db");
  EXPECT_EQ(p.mode, "local");
  EXPECT_EQ(p.local_db, "/tmp/x.db");
  setenv("YOLO8_QUOTA_TOKEN", "tok", 1);
  const ClientConfig u = client_config_from_setting("http://quotad:8470");
  EXPECT_EQ(u.mode, "http://quotad:8470");
  EXPECT_EQ(u.token, "tok");
  EXPECT_TRUE(u.ca_file.empty());
  // Https, with the CA file from the environment
  setenv("YOLO8_QUOTA_CA_FILE", "/etc/yolo8/quotad-ca.pem", 1);
  const ClientConfig s = client_config_from_setting("https://quotad:8443");
  EXPECT_EQ(s.mode, "https://quotad:8443");
  EXPECT_EQ(s.token, "tok");
  EXPECT_EQ(s.ca_file, "/etc/yolo8/quotad-ca.pem");
  unsetenv("YOLO8_QUOTA_CA_FILE");
  unsetenv("YOLO8_QUOTA_TOKEN");
  EXPECT_THROW(client_config_from_setting("https://"), std::invalid_argument);
  EXPECT_THROW(client_config_from_setting("remote"), std::invalid_argument);
}

TEST(QuotaClientLocal, TwoTrainingsOnOneWorkstationTakeTurns) {
  const std::string db = temp_db("local_turns");
  QuotaClient first(local_config(db, 1));
  QuotaClient second(local_config(db, 1));
  LeaseRequest r;
  r.model = "yolov8n";
  r.job = "a";
  const LeaseInfo a = first.acquire(r);
  EXPECT_EQ(a.state, LeaseState::kGranted);
  EXPECT_EQ(a.devices, std::vector<std::string>{"local:0"});
  first.start_heartbeats();
  std::vector<int> positions;
  std::atomic<bool> granted{false};
  std::thread waiter([&] {
    r.job = "b";
    second.acquire(r, [&](const WaitInfo& w) { positions.push_back(w.position); });
    granted = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_FALSE(granted);
  first.release(Outcome::kCompleted);
  waiter.join();
  EXPECT_TRUE(granted);
  ASSERT_FALSE(positions.empty());
  EXPECT_EQ(positions.front(), 1);
  second.release(Outcome::kCompleted);
}

// The trainer passes this machine's GPUs as the local inventory (local:i is CUDA ordinal i): two trainings
// sharing the database hold different GPUs at once, each with the GPU's memory.
TEST(QuotaClientLocal, TheMachinesGpusAreTheInventory) {
  const std::string db = temp_db("local_inventory");
  QuotaClient first(local_config(db, 4));
  QuotaClient second(local_config(db, 4));
  LeaseRequest r;
  r.model = "yolov8n";
  r.job = "a";
  const LeaseInfo a = first.acquire(r, {}, 1.0);
  r.job = "b";
  const LeaseInfo b = second.acquire(r, {}, 1.0);
  EXPECT_EQ(a.devices, std::vector<std::string>{"local:0"});
  EXPECT_EQ(b.devices, std::vector<std::string>{"local:1"});
  EXPECT_DOUBLE_EQ(b.memory_gib, 24);
  r.job = "pair";
  r.gpus = 2;
  QuotaClient third(local_config(db, 4));
  EXPECT_EQ(third.acquire(r, {}, 1.0).devices, (std::vector<std::string>{"local:2", "local:3"}));
  for (QuotaClient* client : {&first, &second, &third}) client->release(Outcome::kCompleted);
}

// The trainer's wait callback throws on SIGTERM: the queued request must be cancelled, or the GPU would be granted
// to a process that is gone and held until the TTL.
TEST(QuotaClientLocal, GivingUpWhileQueuedCancelsTheRequest) {
  const std::string db = temp_db("local_give_up");
  QuotaClient first(local_config(db, 1));
  QuotaClient quitter(local_config(db, 1));
  QuotaClient third(local_config(db, 1));
  LeaseRequest r;
  r.model = "yolov8n";
  r.job = "a";
  first.acquire(r);
  r.job = "quitter";
  int waits = 0;
  EXPECT_THROW(quitter.acquire(r,
                               [&](const WaitInfo&) {
                                 if (++waits == 2) throw std::runtime_error("SIGTERM");
                               }),
               std::runtime_error);
  EXPECT_EQ(waits, 2);
  first.release(Outcome::kCompleted);
  r.job = "c";
  // Granted at once: nothing is queued ahead of it any more (1 s is many polls).
  EXPECT_EQ(third.acquire(r, {}, 1.0).state, LeaseState::kGranted);
  third.release(Outcome::kCompleted);
}

TEST(QuotaClientLocal, AdmissionUsesTheMemoryTableAndReportsTheLargestBatch) {
  ClientConfig c = local_config(temp_db("local_admission"), 1);
  c.local_memory_table = std::string(yolo8::test::kSourceDir) + "/configs/memory-table.yaml";
  QuotaClient q(c);
  LeaseRequest r;
  r.model = "yolov8x";
  r.batch = 64;  // 5 + 0.85 * 64 = 59.4 GiB > 24
  try {
    q.acquire(r);
    FAIL() << "expected a refusal";
  } catch (const QuotaRefused& e) {
    EXPECT_EQ(e.status(), 422);
    EXPECT_EQ(e.max_batch(), 22);  // floor((24 - 5) / 0.85)
    EXPECT_NE(std::string(e.what()).find("batch=auto"), std::string::npos) << e.what();
  }
  r.batch = 16;
  EXPECT_EQ(q.acquire(r).state, LeaseState::kGranted);
  q.release(Outcome::kCompleted);
}

TEST(QuotaClientLocal, ProcessesSharingTheDatabaseNeverOverAllocate) {
  const std::string db = temp_db("local_procs");
  constexpr int kProcs = 6;
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  std::vector<pid_t> kids;
  for (int i = 0; i < kProcs; ++i) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      char result = 'E';
      try {
        QuotaClient q(local_config(db, 2));
        LeaseRequest r;
        r.job = "proc" + std::to_string(i);
        try {
          q.acquire(r, {}, 1.0);
          result = 'G';
          if (write(fds[1], &result, 1) != 1) _exit(3);
          std::this_thread::sleep_for(std::chrono::milliseconds(2500));
          q.release(Outcome::kCompleted);
          _exit(0);
        } catch (const std::runtime_error& error) {
          result = 'Q';  // gave up waiting: the two GPUs were held
          std::fprintf(stderr, "proc %d: %s\n", i, error.what());
        }
      } catch (const std::exception& error) {
        result = 'E';
        std::fprintf(stderr, "proc %d failed: %s\n", i, error.what());
      } catch (...) {
        result = 'E';
      }
      if (write(fds[1], &result, 1) != 1) _exit(3);
      _exit(0);
    }
    kids.push_back(pid);
  }
  close(fds[1]);
  std::string results;
  char ch;
  while (read(fds[0], &ch, 1) == 1) results += ch;
  close(fds[0]);
  for (pid_t k : kids) {
    int status = 0;
    waitpid(k, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  EXPECT_EQ(std::count(results.begin(), results.end(), 'G'), 2) << results;
  EXPECT_EQ(std::count(results.begin(), results.end(), 'Q'), kProcs - 2) << results;
  // the shared state is sound and nothing is left running
  ServiceOptions o;
  o.db_path = db;
  o.reload_per_call = true;
  QuotaService s(local_policy(2, 24, "me"), o);
  EXPECT_TRUE(s.check_invariants().empty());
  s.inspect([](const Engine& e) {
    for (const auto& [id, l] : e.leases()) EXPECT_TRUE(is_terminal(l.state)) << "lease " << id;
  });
}

}  // namespace
}  // namespace yolo8::quota
