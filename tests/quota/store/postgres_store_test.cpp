#include "quota/store/postgres_store.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "tests/quota/postgres_cluster.h"
#include "tests/quota/quota_test_util.h"

namespace yolo8::quota {
namespace {

using testing::PostgresCluster;

std::string query_text(const std::string& url, const std::string& sql) { return PostgresCluster::query_text(url, sql); }

std::string open_error(const std::string& url) {
  try {
    PostgresStore store(url, "");
  } catch (const StoreError& error) {
    return error.what();
  }
  ADD_FAILURE() << "opened";
  return "";
}

// A new database gets every step in one go, recorded in schema_version; it has no history, so nothing is audited.
TEST(QuotaPostgresSchema, AFreshDatabaseIsBroughtToTheCurrentVersionWithoutAuditEntries) {
  const std::string url = PostgresCluster::get().fresh_database("fresh");
  PostgresStore store(url, "");
  EXPECT_EQ(store.schema_version(), kSchemaVersion);
  EXPECT_EQ(query_text(url, "SELECT MAX(version) FROM schema_version"), std::to_string(kSchemaVersion));
  EXPECT_EQ(query_text(url, "SELECT COUNT(*) FROM audit"), "0");
  for (const char* table : {"meta", "leases", "approvals", "audit", "usage", "heartbeats", "quarantine", "loans",
                            "grants", "memory_observations", "receipt_key", "heartbeat_hours"}) {
    EXPECT_EQ(query_text(url, std::string("SELECT to_regclass('") + table + "') IS NOT NULL"), "t") << table;
  }
  // the receipt key: 32 random bytes (hex), created once and kept by the next open
  const std::string key = query_text(url, "SELECT secret FROM receipt_key");
  EXPECT_EQ(key.size(), 64u);
  EXPECT_EQ(store.receipt_key().size(), 32u);
  PostgresStore again(url, "");
  EXPECT_EQ(query_text(url, "SELECT secret FROM receipt_key"), key);
}

TEST(QuotaPostgresSchema, ReopeningAtTheSameVersionChangesNothing) {
  const std::string url = PostgresCluster::get().fresh_database("reopen");
  { PostgresStore create(url, ""); }
  const std::string applied =
      query_text(url, "SELECT string_agg(version || ':' || applied_ms, ',') FROM schema_version");
  PostgresStore store(url, "");
  EXPECT_EQ(store.schema_version(), kSchemaVersion);
  EXPECT_EQ(query_text(url, "SELECT string_agg(version || ':' || applied_ms, ',') FROM schema_version"), applied);
  EXPECT_EQ(query_text(url, "SELECT COUNT(*) FROM audit"), "0");
}

TEST(QuotaPostgresSchema, ADatabaseOfANewerVersionIsRefusedNamingBothVersions) {
  const std::string url = PostgresCluster::get().fresh_database("newer");
  { PostgresStore create(url, ""); }
  PostgresCluster::execute(url, "INSERT INTO schema_version VALUES (99, 'from the future', 0)");
  const std::string error = open_error(url);
  EXPECT_NE(error.find(url + ": the quota database has schema version 99, this quotad knows up to " +
                       std::to_string(kSchemaVersion)),
            std::string::npos)
      << error;
}

// A database of version 9 (quotad before bounded history) gets step 10, audited, its rows kept.
TEST(QuotaPostgresSchema, AVersion9DatabaseGetsTheHourlySummariesStepAudited) {
  const std::string url = PostgresCluster::get().fresh_database("from9");
  { PostgresStore create(url, ""); }
  PostgresCluster::execute(url,
                           "DROP TABLE heartbeat_hours; DROP INDEX heartbeats_ts; DELETE FROM schema_version WHERE "
                           "version = 10; INSERT INTO heartbeats(lease_id, ts_ms, gpu_util) VALUES (4, 1000, 0.5)");
  PostgresStore store(url, "");
  EXPECT_EQ(store.schema_version(), 10);
  EXPECT_EQ(query_text(url, "SELECT to_regclass('heartbeat_hours') IS NOT NULL"), "t");
  EXPECT_EQ(store.count_heartbeats(), 1);
  EXPECT_EQ(query_text(url, "SELECT detail FROM audit WHERE action = 'schema.migrate'"),
            "schema version 9 -> 10: heartbeats older than the retention period folded into hourly summaries per "
            "lease");
}

// A database that holds someone else's table of the same name: the step fails, naming itself, and nothing is left
// behind (the steps and their record are one transaction).
TEST(QuotaPostgresSchema, AStepThatFailsLeavesTheDatabaseAsItWas) {
  const std::string url = PostgresCluster::get().fresh_database("foreign");
  PostgresCluster::execute(url, "CREATE TABLE leases (anything TEXT)");
  const std::string error = open_error(url);
  EXPECT_NE(error.find("schema step 0 -> 8"), std::string::npos) << error;  // the first step, the layout of 8
  EXPECT_NE(error.find("nothing was changed, the database stays at schema version 0"), std::string::npos) << error;
  EXPECT_EQ(query_text(url, "SELECT to_regclass('schema_version') IS NULL AND to_regclass('meta') IS NULL"), "t");
}

// A connection lost between transactions (the server restarted, an idle timeout) is made again at the next call;
// a transaction it was in is lost, not reported committed.
TEST(QuotaPostgresStore, ALostConnectionIsMadeAgainBetweenTransactionsButNotInsideOne) {
  const std::string url = PostgresCluster::get().fresh_database("reconnect");
  const auto terminate = [&] {
    PostgresCluster::execute(url,
                             "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = "
                             "'quotad' AND datname = current_database()");
  };
  PostgresStore store(url, "");
  store.set_meta("k", "1");
  terminate();
  EXPECT_EQ(store.meta("k"), "1");
  terminate();
  store.set_meta("k", "2");
  EXPECT_EQ(store.meta("k"), "2");
  store.begin_immediate();
  store.set_meta("k", "3");
  terminate();
  EXPECT_THROW(store.commit(), StoreError);
  EXPECT_EQ(store.meta("k"), "2");
}

// A writer that waited for the lock reads what the holder committed, whatever isolation the server defaults to:
// here the second writer's audit entry links to the first's (a snapshot taken before the lock was granted would
// link it to nothing and break the chain).
TEST(QuotaPostgresStore, AWriterThatWaitedReadsWhatTheHolderCommitted) {
  const std::string url = PostgresCluster::get().fresh_database("waited");
  const std::string scheme = "postgresql:///";
  PostgresCluster::execute(url, "ALTER DATABASE \"" + url.substr(scheme.size(), url.find('?') - scheme.size()) +
                                    "\" SET default_transaction_isolation = 'repeatable read'");
  PostgresStore holder(url, ""), other(url, "");
  const Engine engine(testing::example_policy());
  Changes first, second;
  first.audit.resize(1);
  first.audit[0].seq = 1;
  second.audit.resize(1);
  second.audit[0].seq = 2;
  holder.begin_immediate();
  holder.write(engine, first);
  std::string failed;
  std::thread waiting([&] {
    try {
      other.write(engine, second);
    } catch (const StoreError& error) {
      failed = error.what();
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the other writer waits for the lock
  holder.commit();
  waiting.join();
  EXPECT_EQ(failed, "");
  const AuditChainCheck check = verify_audit_chain(parse_db_target(url), StoreOptions());
  EXPECT_TRUE(check.intact) << check.problem;
  EXPECT_EQ(check.head_seq, 2);
}

// The password comes from --db-password-file or libpq's PGPASSWORD; a wrong one is libpq's error, naming the URL.
TEST(QuotaPostgresStore, ThePasswordComesFromItsFileOrLibpqsEnvironment) {
  const std::string admin = PostgresCluster::get().fresh_database("password");
  const std::string scheme = "postgresql:///";  // the cluster's URLs: postgresql:///DB?host=...
  const std::string database = admin.substr(scheme.size(), admin.find('?') - scheme.size());
  PostgresCluster::execute(admin, std::string("DROP ROLE IF EXISTS ") + testing::kPasswordRole + "; CREATE ROLE " +
                                      testing::kPasswordRole + " LOGIN PASSWORD 's3cret'; ALTER DATABASE \"" +
                                      database + "\" OWNER TO " + testing::kPasswordRole);
  const std::string url = admin.substr(0, admin.find("&user=")) + "&user=" + testing::kPasswordRole;
  const std::string file = testing::temp_db("password_file");
  StoreOptions options;
  options.password_file = file;
  std::ofstream(file) << "s3cret\n";
  EXPECT_EQ(open_store(parse_db_target(url), options)->meta("audit_head"), "");
  std::ofstream(file) << "wrong\n";
  try {
    open_store(parse_db_target(url), options);
    ADD_FAILURE() << "opened with a wrong password";
  } catch (const StoreError& error) {
    EXPECT_NE(std::string(error.what()).find(url + ": cannot connect to the quota database: "), std::string::npos)
        << error.what();
    EXPECT_NE(std::string(error.what()).find("password authentication failed"), std::string::npos) << error.what();
  }
  EXPECT_THROW(open_store(parse_db_target(url)), StoreError) << "no password at all";
  setenv("PGPASSWORD", "s3cret", 1);
  EXPECT_NO_THROW(open_store(parse_db_target(url)));
  unsetenv("PGPASSWORD");
  std::filesystem::remove(file);
}

TEST(QuotaPostgresSchema, AServerThatCannotBeReachedIsNamed) {
  const std::string url = "postgresql:///quota?host=/nonexistent&user=postgres";
  const std::string error = open_error(url);
  EXPECT_EQ(error.rfind(url + ": cannot connect to the quota database: ", 0), 0u) << error;
}

// The throwaway cluster of a test binary that crashes (no destructor runs) is stopped and its folder removed once
// the binary is gone, so a crash leaves no PostgreSQL running behind it.
TEST(QuotaPostgresCluster, TheClusterOfACrashedTestBinaryIsStoppedAndRemoved) {
  int channel[2];
  ASSERT_EQ(pipe2(channel, O_CLOEXEC), 0);  // the cluster the child starts must not hold the pipe open
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(channel[0]);
    auto* cluster = new PostgresCluster();  // never deleted: the crash
    const std::string url = cluster->url("postgres");
    const bool written = write(channel[1], url.data(), url.size()) == static_cast<ssize_t>(url.size());
    _exit(written ? 0 : 1);
  }
  close(channel[1]);
  std::string url;
  char buffer[512];
  for (ssize_t got; (got = read(channel[0], buffer, sizeof buffer)) > 0;) url.append(buffer, static_cast<size_t>(got));
  close(channel[0]);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the child could not start a cluster";
  const auto host = url.find("host=");
  ASSERT_NE(host, std::string::npos) << url;
  const std::filesystem::path folder = url.substr(host + 5, url.find('&', host) - host - 5);
  ASSERT_TRUE(std::filesystem::exists(folder)) << folder;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(15);
  while (std::filesystem::exists(folder) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_FALSE(std::filesystem::exists(folder)) << folder << " outlived the crashed binary";
  EXPECT_THROW(PostgresCluster::query_text(url, "SELECT 1"), std::runtime_error) << "the server still answers";
}

}  // namespace
}  // namespace yolo8::quota
