// Restoring quotad's database with the real binary: a backup, five more grants, then the file gone. `serve` refuses
// to start an empty database beside the backup, `repair-db` restores it, and no lease id handed out after the
// backup comes again; `audit --verify` names the entries the restore lost.
#include <httplib.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "tests/quota/quota_test_util.h"
#include "tests/quota/quotad_process.h"

namespace yolo8::quota {
namespace {

namespace fs = std::filesystem;
using testing::read_text;
using yolo8::test::run_quotad;

// A one-GPU lease for `token`, released at once when `release`; its id, -1 when refused.
int64_t lease(httplib::Client& client, const std::string& token, bool release) {
  const httplib::Headers auth = {{"Authorization", "Bearer " + token}};
  const auto granted =
      client.Post("/v1/leases", auth, R"({"model":"yolov8s","gpus":1,"job":"restore"})", "application/json");
  if (!granted || granted->status != 201) return -1;
  const int64_t id = nlohmann::json::parse(granted->body)["lease"]["id"].get<int64_t>();
  if (release) {
    const auto released =
        client.Post(("/v1/leases/" + std::to_string(id) + "/release").c_str(), auth, "{}", "application/json");
    if (!released || released->status != 200) return -1;
  }
  return id;
}

TEST(QuotadRestore, ABackupThenFiveGrantsThenTheFileGone) {
  const fs::path dir = fs::path(yolo8::test::kBinaryDir) / "quota_test_tmp" / "restore_gone";
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::copy_file(fs::path(testing::example_policy_path()).parent_path() / "memory-table.yaml",
                dir / "memory-table.yaml");
  fs::copy_file(testing::example_policy_path(), dir / "policy.yaml");
  const std::string db = (dir / "quota.db").string();
  const std::string log = (dir / "quotad.log").string();
  const std::string out = (dir / "command.out").string();
  const std::vector<std::string> no_backups = {"--backup-every", "0"};

  int64_t last = 0;
  {
    yolo8::test::QuotadProcess quotad;
    ASSERT_TRUE(quotad.start((dir / "policy.yaml").string(), db, log, no_backups)) << read_text(log);
    httplib::Client client(quotad.url());
    ASSERT_GT(lease(client, "alice-token", true), 0) << read_text(log);
    ASSERT_EQ(run_quotad({"backup", "--db", db}, out), 0) << read_text(out);
    for (int i = 0; i < 5; ++i) last = lease(client, "alice-token", i < 4);  // the last one still running
    ASSERT_EQ(last, 6);
    ASSERT_TRUE(quotad.stop());
  }
  for (const char* suffix : {"", "-wal", "-shm"}) fs::remove(db + suffix);

  EXPECT_EQ(run_quotad({"serve", "--policy", (dir / "policy.yaml").string(), "--db", db, "--listen", "127.0.0.1:0",
                        "--backup-every", "0"},
                       out, 20),
            1);
  EXPECT_NE(read_text(out).find("quotad repair-db --db " + db), std::string::npos) << read_text(out);
  EXPECT_FALSE(fs::exists(db));

  ASSERT_EQ(run_quotad({"repair-db", "--db", db}, out), 0) << read_text(out);
  EXPECT_NE(read_text(out).find("restored from the backup " + db + ".backup-"), std::string::npos) << read_text(out);
  EXPECT_NE(read_text(out).find("ids continue at 2000000000"), std::string::npos) << read_text(out);

  yolo8::test::QuotadProcess restored;
  ASSERT_TRUE(restored.start((dir / "policy.yaml").string(), db, log, no_backups)) << read_text(log);
  httplib::Client client(restored.url());
  const auto beat = client.Post(("/v1/leases/" + std::to_string(last) + "/heartbeat").c_str(),
                                {{"Authorization", "Bearer alice-token"}}, "{}", "application/json");
  ASSERT_TRUE(beat);
  EXPECT_EQ(beat->status, 404) << "lease " << last << " was granted after the backup: unknown, never someone else's";
  EXPECT_EQ(lease(client, "alice-token", false), 2000000000);
  EXPECT_TRUE(restored.stop());

  ASSERT_EQ(run_quotad({"audit", "--verify", "--db", db}, out), 0) << read_text(out);
  EXPECT_NE(read_text(out).find("chain intact"), std::string::npos) << read_text(out);
  EXPECT_NE(read_text(out).find("recorded gap: entries "), std::string::npos) << read_text(out);
  EXPECT_NE(read_text(out).find("lost: the database was missing; restored from quota.db.backup-"), std::string::npos)
      << read_text(out);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace yolo8::quota
