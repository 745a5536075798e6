// `quotad memory-table --observed` on a database of real heartbeats: one table per device, precision and LibTorch
// version, the version named in the provenance; `quotad serve`'s TLS flags refused when they cannot work; the
// exit-code contract yolo8 and quotad share (common/exit_codes.h).
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
#include <vector>

#include "common/exit_codes.h"
#include "quota/core/policy.h"
#include "quota/store/store.h"
#include "tests/quota/quota_test_util.h"
#include "tests/quota/quotad_process.h"

namespace yolo8::quota {
namespace {

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Runs quotad with `args`, stdout to `out` and stderr to `err`; the exit status.
int quotad(const std::string& args, const std::string& out, const std::string& err) {
  const std::string command =
      std::string(yolo8::test::kBinaryDir) + "/quota/quotad " + args + " > " + out + " 2> " + err;
  const int status = std::system(command.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// Runs of LibTorch 2.1.2 and 2.5.1 on one device: the command will not mix them, names both, and writes the one
// asked for with its version in the provenance; runs that did not say their version make a table without one.
TEST(QuotadMemoryTable, OneTablePerLibtorchVersionNamedInItsProvenance) {
  const std::string db = testing::temp_db("memory_table_cli");
  {
    Store store(db);
    Telemetry beat;
    beat.model = "yolov8n";
    beat.imgsz = 640;
    beat.amp = 0;
    beat.device_name = "NVIDIA L4";
    int64_t lease = 1;
    for (const char* version : {"2.1.2", "2.5.1"}) {
      beat.libtorch = version;
      for (const int batch : {8, 32}) {
        beat.batch = batch;
        beat.memory_used_gib = (beat.libtorch == "2.1.2" ? 0.21 : 0.18) * batch + 0.5;
        store.write_heartbeats({{lease, 1000 * lease, beat}});
        ++lease;
      }
    }
  }
  const std::string out = db + ".yaml", err = db + ".err";
  EXPECT_EQ(quotad("memory-table --observed --db " + db, out, err), 2);
  const std::string refusal = read_text(err);
  EXPECT_NE(refusal.find("choose one with --device and --libtorch"), std::string::npos) << refusal;
  EXPECT_NE(refusal.find("NVIDIA L4, float32, LibTorch 2.1.2"), std::string::npos) << refusal;
  EXPECT_NE(refusal.find("NVIDIA L4, float32, LibTorch 2.5.1"), std::string::npos) << refusal;

  ASSERT_EQ(quotad("memory-table --observed --db " + db + " --libtorch 2.5.1 --out " + out, "/dev/null", err), 0)
      << read_text(err);
  const MemoryTable table = load_memory_table(out);
  EXPECT_EQ(table.provenance.libtorch, "2.5.1");
  EXPECT_EQ(table.provenance.device, "NVIDIA L4");
  EXPECT_NEAR(table.estimate_gib("yolov8n", 640, 16), 0.5 + 0.18 * 16, 1e-4);
  const std::string check = db + ".check";
  ASSERT_EQ(quotad("check-policy --memory-table " + out + " " + testing::example_policy_path(), check, err), 0)
      << read_text(err);
  EXPECT_NE(read_text(check).find("measured on NVIDIA L4, float32, LibTorch 2.5.1"), std::string::npos)
      << read_text(check);

  // an older trainer's runs: no version to name, and the command says so
  {
    Store store(db);
    Telemetry beat;
    beat.model = "yolov8s";
    beat.imgsz = 640;
    beat.batch = 8;
    beat.amp = 1;
    beat.device_name = "NVIDIA L4";
    beat.memory_used_gib = 3.0;
    store.write_heartbeats({{9, 9000, beat}});
  }
  ASSERT_EQ(quotad("memory-table --observed --db " + db + " --libtorch unknown --out " + out, "/dev/null", err), 0)
      << read_text(err);
  EXPECT_EQ(load_memory_table(out).provenance.libtorch, "");
  EXPECT_NE(read_text(err).find("did not report their LibTorch version"), std::string::npos) << read_text(err);
}

// check-policy says which per-process overhead shared placement counts (the policy's default, or the memory
// table's measured figure), and a learned table written over a measured one keeps the figure of its device.
TEST(QuotadMemoryTable, TheProcessOverheadIsNamedByCheckPolicyAndKeptByTheLearnedTable) {
  const std::string db = testing::temp_db("memory_table_overhead");
  const std::string out = db + ".out", err = db + ".err", table = db + ".yaml", policy = db + ".policy.yaml";
  ASSERT_EQ(quotad("check-policy " + testing::example_policy_path(), out, err), 0) << read_text(err);
  EXPECT_NE(read_text(out).find("shared GPUs: each lease takes its share plus 0.75 GiB per process "
                                "(sharing.process_overhead_gib, a default until measured on the GPU)"),
            std::string::npos)
      << read_text(out);

  const std::string measured =
      "source: yolo8 profile\nprovenance: {device: NVIDIA L4, precision: float32, date: \"2026-12-01\"}\n"
      "process_overhead_gib: 0.6\nmodels:\n  yolov8n: {fixed_gib: 0.5, per_image_gib: 0.2}\n";
  std::ofstream(table) << measured;
  std::string text = read_text(testing::example_policy_path());
  const std::string key = "memory_table: memory-table.yaml";
  ASSERT_NE(text.find(key), std::string::npos);
  text.replace(text.find(key), key.size(), "memory_table: " + table);
  std::ofstream(policy) << text;
  ASSERT_EQ(quotad("check-policy " + policy, out, err), 0) << read_text(err);
  EXPECT_NE(read_text(out).find("process_overhead_gib 0.60: the measured per-process GPU memory"), std::string::npos)
      << read_text(out);
  EXPECT_NE(read_text(out).find("shared GPUs: each lease takes its share plus 0.60 GiB per process (measured: memory "
                                "table " +
                                table + " process_overhead_gib, yolo8 profile, NVIDIA L4, float32, 2026-12-01)"),
            std::string::npos)
      << read_text(out);

  {
    Store store(db);
    Telemetry beat;
    beat.model = "yolov8n";
    beat.imgsz = 640;
    beat.amp = 0;
    beat.device_name = "NVIDIA L4";
    beat.libtorch = "2.5.1";
    for (const int batch : {8, 32}) {
      beat.batch = batch;
      beat.memory_used_gib = 0.5 + 0.2 * batch;
      store.write_heartbeats({{batch, 1000 * batch, beat}});
    }
  }
  ASSERT_EQ(quotad("memory-table --observed --db " + db + " --out " + table, "/dev/null", err), 0) << read_text(err);
  EXPECT_NE(read_text(err).find("kept process_overhead_gib 0.60 from " + table), std::string::npos) << read_text(err);
  EXPECT_DOUBLE_EQ(load_memory_table(table).process_overhead_gib, 0.6);
  EXPECT_NE(load_memory_table(table).source.find("observed"), std::string::npos);
  // measured on another device: not this device's overhead, so left out, and the command says so
  std::string other = measured;
  other.replace(other.find("NVIDIA L4"), 9, "NVIDIA H200");
  std::ofstream(table) << other;
  ASSERT_EQ(quotad("memory-table --observed --db " + db + " --out " + table, "/dev/null", err), 0) << read_text(err);
  EXPECT_NE(read_text(err).find("dropped process_overhead_gib 0.60 of " + table +
                                ": measured on NVIDIA H200, not "
                                "NVIDIA L4"),
            std::string::npos)
      << read_text(err);
  EXPECT_DOUBLE_EQ(load_memory_table(table).process_overhead_gib, -1);
}

// --tls-cert and --tls-key go together, and a file that is no PEM is refused naming the flag and the
// file, before anything is served.
TEST(QuotadServe, TlsFlagsComeTogetherAndMustNamePemFiles) {
  const std::string dir = std::string(yolo8::test::kBinaryDir) + "/quota_test_tmp";
  const std::string out = dir + "/serve_tls.out", err = dir + "/serve_tls.err";
  const std::string policy = testing::example_policy_path();
  const std::string serve =
      "serve --policy " + policy + " --db " + testing::temp_db("serve_tls") + " --listen 127.0.0.1:0 ";
  EXPECT_NE(quotad(serve + "--tls-cert " + policy, out, err), 0);
  EXPECT_NE(read_text(err).find("--tls-key"), std::string::npos) << read_text(err);
  EXPECT_EQ(quotad(serve + "--tls-cert " + policy + " --tls-key " + policy, out, err), 1);
  EXPECT_NE(read_text(err).find("--tls-cert: '" + policy + "' is not a PEM file"), std::string::npos) << read_text(err);
  EXPECT_EQ(read_text(out).find("serving"), std::string::npos) << read_text(out);
}

// --heartbeat-retention-days is a whole number of days of at least one, refused naming the flag otherwise.
TEST(QuotadServe, TheHeartbeatRetentionIsValidatedNamingTheFlag) {
  const std::string dir = std::string(yolo8::test::kBinaryDir) + "/quota_test_tmp";
  const std::string out = dir + "/serve_retention.out", err = dir + "/serve_retention.err";
  const std::string serve = "serve --policy " + testing::example_policy_path() + " --db " +
                            testing::temp_db("serve_retention") + " --listen 127.0.0.1:0 --heartbeat-retention-days ";
  for (const char* bad : {"0", "-3", "two"}) {
    EXPECT_NE(quotad(serve + bad, out, err), 0) << bad;
    EXPECT_NE(read_text(err).find("--heartbeat-retention-days"), std::string::npos) << read_text(err);
    EXPECT_EQ(read_text(out).find("serving"), std::string::npos) << read_text(out);
  }
}

// One quotad per SQLite database: a second `quotad serve` on the file refuses to start, naming the first (before,
// it started, expired the first one's running leases in the database and locked it out of writing); the first
// keeps serving, and once it is gone the database can be served again.
TEST(QuotadServe, ASecondQuotadOnTheSameDatabaseRefusesToStart) {
  const std::string dir = std::string(yolo8::test::kBinaryDir) + "/quota_test_tmp";
  const std::string db = testing::temp_db("one_writer"), out = dir + "/one_writer.out", err = dir + "/one_writer.err";
  const std::string policy = testing::example_policy_path();
  yolo8::test::QuotadProcess first;
  ASSERT_TRUE(first.start(policy, db, dir + "/one_writer_first.log"));
  const std::string serve = "serve --policy " + policy + " --db " + db + " --listen 127.0.0.1:0";
  // `timeout`: without the lock the second would serve until killed
  const std::string command =
      "timeout 20 " + std::string(yolo8::test::kBinaryDir) + "/quota/quotad " + serve + " > " + out + " 2> " + err;
  const int status = std::system(command.c_str());
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 1) << read_text(err);
  EXPECT_NE(read_text(err).find("is served by another quotad (pid "), std::string::npos) << read_text(err);
  EXPECT_EQ(read_text(out).find("serving"), std::string::npos) << read_text(out);
  httplib::Client client("127.0.0.1", first.port());
  const auto health = client.Get("/healthz");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  first.kill_hard();  // a crash releases the lock too
  yolo8::test::QuotadProcess next;
  EXPECT_TRUE(next.start(policy, db, dir + "/one_writer_next.log"));
  EXPECT_TRUE(next.stop());
}

// A quotad restarted more often than --backup-every still backs up: the first backup is due from the newest one
// beside the database, at once when there is none (before, the clock restarted at every start: with a restart every
// 50 s and --backup-every 1, 0 backups in 150 s).
TEST(QuotadServe, ABackupAtStartWhenTheNewestIsOverdueAndNoneWhenItIsFresh) {
  const std::string dir = std::string(yolo8::test::kBinaryDir) + "/quota_test_tmp";
  const std::string db = testing::temp_db("backup_at_start");
  const std::filesystem::path file(db);
  const auto backups = [&] {
    int count = 0;
    for (const auto& entry : std::filesystem::directory_iterator(file.parent_path())) {
      const std::string name = entry.path().filename().string();
      if (name.rfind(file.filename().string() + ".backup-", 0) == 0) ++count;
    }
    return count;
  };
  for (const auto& entry : std::filesystem::directory_iterator(file.parent_path())) {
    if (entry.path().filename().string().rfind(file.filename().string() + ".backup-", 0) == 0) {
      std::filesystem::remove(entry.path());
    }
  }
  const std::vector<std::string> every_hour = {"--backup-every", "60"};
  for (int start = 0; start < 2; ++start) {
    yolo8::test::QuotadProcess quotad;
    ASSERT_TRUE(quotad.start(testing::example_policy_path(), db, dir + "/backup_at_start.log", every_hour));
    // the first start finds none and backs up at once; the second finds a fresh one and waits an hour
    for (int i = 0; i < 100 && backups() < 1; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    EXPECT_EQ(backups(), 1) << "start " << start << ": " << read_text(dir + "/backup_at_start.log");
    EXPECT_TRUE(quotad.stop());
  }
}

// The served /metrics carry the newest backup's age: the one taken at start, seconds old.
TEST(QuotadServe, TheBackupAgeIsExported) {
  const std::string dir = std::string(yolo8::test::kBinaryDir) + "/quota_test_tmp";
  const std::string db = testing::temp_db("backup_age");
  const std::filesystem::path file(db);
  for (const auto& entry : std::filesystem::directory_iterator(file.parent_path())) {
    if (entry.path().filename().string().rfind(file.filename().string() + ".backup-", 0) == 0) {
      std::filesystem::remove(entry.path());
    }
  }
  yolo8::test::QuotadProcess quotad;
  ASSERT_TRUE(quotad.start(testing::example_policy_path(), db, dir + "/backup_age.log", {"--backup-every", "60"}));
  httplib::Client client(quotad.url());
  std::string metrics;
  for (int i = 0; i < 100; ++i) {
    const auto response = client.Get("/metrics");
    ASSERT_TRUE(response);
    metrics = response->body;
    if (metrics.find("\nquotad_backup_age_seconds +Inf") == std::string::npos) break;  // the first is taken at once
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_NE(metrics.find("\nquotad_backup_interval_seconds 3600\n"), std::string::npos) << metrics;
  const auto at = metrics.find("\nquotad_backup_age_seconds ");
  ASSERT_NE(at, std::string::npos) << metrics;
  const double age = std::stod(metrics.substr(at + 28));
  EXPECT_GE(age, 0);
  EXPECT_LT(age, 30);
  EXPECT_TRUE(quotad.stop());
}

// quotad keeps the exit-code contract of yolo8 (common/exit_codes.h): 0 done, 2 for what retrying cannot change (a
// bad flag, policy or value, a database the command cannot use, a request the server refused as such), 1 for the
// rest (an unreachable server, a broken audit chain).
TEST(QuotadExitCodes, FollowTheContractYolo8Shares) {
  const std::string dir = std::string(yolo8::test::kBinaryDir) + "/quota_test_tmp";
  const std::string out = dir + "/exit_codes.out", err = dir + "/exit_codes.err";
  EXPECT_EQ(quotad("--help", out, err), kExitCompleted);
  EXPECT_EQ(quotad("", out, err), kExitBadInput);
  EXPECT_EQ(quotad("serve --no-such-flag", out, err), kExitBadInput);
  EXPECT_NE(read_text(err).find("--no-such-flag"), std::string::npos) << read_text(err);
  EXPECT_EQ(quotad("serve --threads 1", out, err), kExitBadInput);
  const std::string policy = dir + "/exit_codes_policy.yaml";
  std::ofstream(policy) << "gpus: lots\n";
  EXPECT_EQ(quotad("check-policy " + policy, out, err), kExitBadInput);
  EXPECT_NE(read_text(err).find(policy), std::string::npos) << read_text(err);
  EXPECT_EQ(quotad("report --month 2026-13 --db " + testing::temp_db("exit_codes"), out, err), kExitBadInput);
  EXPECT_NE(read_text(err).find("--month"), std::string::npos) << read_text(err);
  EXPECT_EQ(quotad("report --quarter 2026-Q1 --month 2026-01", out, err), kExitBadInput);
  EXPECT_EQ(quotad("teams --server http://127.0.0.1:1", out, err), kExitFailure);
  EXPECT_NE(read_text(err).find("cannot reach http://127.0.0.1:1"), std::string::npos) << read_text(err);

  yolo8::test::QuotadProcess server;
  ASSERT_TRUE(server.start(testing::example_policy_path(), testing::temp_db("exit_codes_served"),
                           dir + "/exit_codes_served.log"));
  EXPECT_EQ(quotad("teams --server " + server.url() + " --token not-a-token", out, err), kExitBadInput);
  EXPECT_NE(read_text(err).find("HTTP 401"), std::string::npos) << read_text(err);
  EXPECT_TRUE(server.stop());
}

}  // namespace
}  // namespace yolo8::quota
