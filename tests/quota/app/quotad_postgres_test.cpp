// `quotad serve --db postgresql://...` on a throwaway PostgreSQL: it serves, restarts onto what it wrote, and its
// audit log verifies; what only SQLite has (backup, repair-db) is refused naming PostgreSQL's own means, and a
// password never comes on the command line.
#include <httplib.h>
#include <sys/wait.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "common/exit_codes.h"
#include "quota/core/calendar.h"
#include "tests/quota/postgres_cluster.h"
#include "tests/quota/quota_test_util.h"
#include "tests/quota/quotad_process.h"

namespace yolo8::quota {
namespace {

using testing::PostgresCluster;
using testing::read_text;
using testing::test_dir;
using yolo8::test::run_quotad;

TEST(QuotadPostgres, ServesRestartsAndVerifiesItsAuditLog) {
  const std::string url = PostgresCluster::get().fresh_database("quotad_serve");
  const std::string dir = test_dir();
  const std::string policy = testing::example_policy_path();
  {
    yolo8::test::QuotadProcess quotad_process;
    ASSERT_TRUE(quotad_process.start(policy, url, dir + "/pg_serve.log"));
    httplib::Client client("127.0.0.1", quotad_process.port());
    const auto granted = client.Post("/v1/leases", {{"Authorization", "Bearer alice-token"}}, R"({"model":"yolov8s"})",
                                     "application/json");
    ASSERT_TRUE(granted);
    EXPECT_EQ(granted->status, 201) << granted->body;
    EXPECT_TRUE(quotad_process.stop());
  }
  EXPECT_NE(read_text(dir + "/pg_serve.log").find("--backup-every does not apply"), std::string::npos);
  {
    yolo8::test::QuotadProcess again;
    ASSERT_TRUE(again.start(policy, url, dir + "/pg_serve_again.log"));
    httplib::Client client("127.0.0.1", again.port());
    const auto lease = client.Get("/v1/leases/1", {{"Authorization", "Bearer alice-token"}});
    ASSERT_TRUE(lease);
    EXPECT_EQ(lease->status, 200) << lease->body;
    EXPECT_NE(lease->body.find(R"("state":"granted")"), std::string::npos) << lease->body;
    EXPECT_TRUE(again.stop());
  }
  const std::string out = dir + "/pg_verify.out";
  EXPECT_EQ(run_quotad({"audit", "--verify", "--db", url}, out), 0) << read_text(out);
  // the grant and each start's replica.lead
  EXPECT_NE(read_text(out).find("3 entries, chain intact; head: entry 3 sha256 "), std::string::npos) << read_text(out);
  // the reports read PostgreSQL as they read SQLite
  const int64_t now =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  EXPECT_EQ(run_quotad({"report", "--month", month_key(now), "--db", url, "--policy", policy}, out), 0)
      << read_text(out);
  EXPECT_NE(read_text(out).find("team-cv"), std::string::npos) << read_text(out);
  EXPECT_EQ(run_quotad({"recommend", "--db", url, "--policy", policy}, out), 0) << read_text(out);
}

TEST(QuotadPostgres, BackupAndRepairAreRefusedNamingPostgresOwnMeans) {
  const std::string url = "postgresql://quotad@db.example/quota";
  const std::string out = test_dir() + "/pg_refused.out";
  EXPECT_EQ(run_quotad({"backup", "--db", url}, out), kExitBadInput);
  EXPECT_NE(read_text(out).find("backup: --db names a PostgreSQL database: back it up with pg_dump"), std::string::npos)
      << read_text(out);
  EXPECT_EQ(run_quotad({"repair-db", "--db", url}, out), kExitBadInput);
  EXPECT_NE(read_text(out).find("repair-db: --db names a PostgreSQL database: "), std::string::npos) << read_text(out);
}

TEST(QuotadPostgres, APasswordInTheUrlIsRefusedBeforeAnythingStarts) {
  const std::string out = test_dir() + "/pg_password.out";
  EXPECT_EQ(run_quotad({"serve", "--policy", testing::example_policy_path(), "--db",
                        "postgresql://quotad:s3cret@db.example/quota", "--listen", "127.0.0.1:0"},
                       out),
            1);
  EXPECT_NE(read_text(out).find("--db: the PostgreSQL URL holds a password"), std::string::npos) << read_text(out);
  EXPECT_NE(read_text(out).find("--db-password-file"), std::string::npos) << read_text(out);
  EXPECT_EQ(read_text(out).find("s3cret"), std::string::npos) << read_text(out);
  EXPECT_EQ(read_text(out).find("serving"), std::string::npos) << read_text(out);
}

// Two `quotad serve` on one database: the second follows; kill -9 of the leader, and the follower serves within
// seconds, the lease granted before intact.
TEST(QuotadPostgres, AKilledLeaderIsReplacedWithinSecondsAndItsLeaseLives) {
  const std::string url = PostgresCluster::get().fresh_database("quotad_replicas");
  const std::string dir = test_dir();
  const std::string policy = testing::example_policy_path();
  yolo8::test::QuotadProcess leader;
  ASSERT_TRUE(leader.start(policy, url, dir + "/pg_leader.log", {"--advertise", "http://leader.example:8470"}));
  yolo8::test::QuotadProcess follower;
  ASSERT_TRUE(follower.start(policy, url, dir + "/pg_follower.log", {"--advertise", "http://follower.example:8470"}));
  httplib::Client to_leader("127.0.0.1", leader.port());
  httplib::Client to_follower("127.0.0.1", follower.port());
  const httplib::Headers alice = {{"Authorization", "Bearer alice-token"}};
  const auto granted = to_leader.Post("/v1/leases", alice, R"({"model":"yolov8s"})", "application/json");
  ASSERT_TRUE(granted);
  ASSERT_EQ(granted->status, 201) << granted->body;
  const auto waiting = to_follower.Get("/readyz");
  ASSERT_TRUE(waiting);
  EXPECT_EQ(waiting->status, 503);
  EXPECT_NE(waiting->body.find("http://leader.example:8470"), std::string::npos) << waiting->body;

  leader.kill_hard();
  const auto killed = std::chrono::steady_clock::now();
  bool ready = false;
  while (!ready && std::chrono::steady_clock::now() - killed < std::chrono::seconds(20)) {
    const auto probe = to_follower.Get("/readyz");
    ready = probe && probe->status == 200;
    if (!ready) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const auto took =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - killed).count();
  std::printf("takeover after kill -9 of the leader: %lld ms\n", static_cast<long long>(took));
  ASSERT_TRUE(ready) << read_text(dir + "/pg_follower.log");
  EXPECT_LT(took, 15000);
  const auto beat = to_follower.Post("/v1/leases/1/heartbeat", alice, "{}", "application/json");
  ASSERT_TRUE(beat);
  EXPECT_EQ(beat->status, 200) << beat->body;
  EXPECT_NE(beat->body.find(R"("state":"granted")"), std::string::npos) << beat->body;
  EXPECT_TRUE(follower.stop());
}

}  // namespace
}  // namespace yolo8::quota
