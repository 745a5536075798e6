// `quotad serve` reloading without a restart: SIGHUP and changed files (the policy, $QUOTAD_TOKENS_FILE, the TLS
// certificate and key, swapped in place as Kubernetes does with a `..data` link), the running version kept when the
// new one is broken, leases kept throughout; the certificate's expiry at start and on reload.
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "quota/core/sha256.h"
#include "tests/quota/quota_test_util.h"
#include "tests/quota/quotad_process.h"
#include "tests/quota/tls_util.h"

namespace yolo8::quota {
namespace {

namespace fs = std::filesystem;

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

// The example policy (and its memory table) in a fresh directory of its own.
std::string fresh_dir(const std::string& name) {
  const fs::path dir = fs::path(yolo8::test::kBinaryDir) / "quota_test_tmp" / ("reload_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

std::string example_text() { return read_text(testing::example_policy_path()); }

void copy_memory_table(const std::string& dir) {
  fs::copy_file(fs::path(testing::example_policy_path()).parent_path() / "memory-table.yaml",
                fs::path(dir) / "memory-table.yaml", fs::copy_options::overwrite_existing);
}

// `text` with the first `from` replaced by `to` (the test fails when it is missing).
std::string edited(std::string text, const std::string& from, const std::string& to) {
  const auto at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}

// A team's base as GET /v1/teams answers it; -1 when absent.
double team_base(httplib::Client& client, const std::string& token, const std::string& team) {
  const auto response = client.Get("/v1/teams", {{"Authorization", "Bearer " + token}});
  if (!response || response->status != 200) {
    return -1;
  }
  const auto reply = nlohmann::json::parse(response->body);  // alive through the loop
  for (const auto& entry : reply["teams"]) {
    if (entry["name"] == team) return entry["base"].get<double>();
  }
  return -1;
}

int post(httplib::Client& client, const std::string& token, const std::string& path, const std::string& body) {
  const auto response = client.Post(path.c_str(), {{"Authorization", "Bearer " + token}}, body, "application/json");
  return response ? response->status : -1;
}

int64_t acquire(httplib::Client& client, const std::string& token) {
  const auto response = client.Post("/v1/leases", {{"Authorization", "Bearer " + token}},
                                    R"({"model":"yolov8s","gpus":1,"job":"reload"})", "application/json");
  if (!response || response->status != 201) return -1;
  return nlohmann::json::parse(response->body)["lease"]["id"].get<int64_t>();
}

// One sample of /metrics ("name{labels}"); -1 when absent.
double metric(httplib::Client& client, const std::string& series) {
  const auto response = client.Get("/metrics");
  if (!response) return -1;
  const auto at = response->body.find("\n" + series + " ");
  return at == std::string::npos ? -1 : std::stod(response->body.substr(at + series.size() + 2));
}

// The audit entries of `action`, their details joined by newlines.
std::string audited(httplib::Client& client, const std::string& action) {
  const auto response = client.Get("/v1/audit?limit=1000", {{"Authorization", "Bearer admin-token"}});
  std::string details;
  if (!response || response->status != 200) return details;
  const auto reply = nlohmann::json::parse(response->body);  // alive through the loop
  for (const auto& entry : reply["audit"]) {
    if (entry["action"] == action) details += entry["detail"].get<std::string>() + "\n";
  }
  return details;
}

// Polls `done` for up to `seconds`.
template <typename Done>
bool eventually(Done done, double seconds = 5) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<int>(seconds * 1000));
  while (std::chrono::steady_clock::now() < until) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return done();
}

TEST(QuotadReload, SighupAppliesAnEditedPolicyKeepsTheLeaseAndAuditsTheDiff) {
  const std::string dir = fresh_dir("sighup");
  copy_memory_table(dir);
  const std::string policy = dir + "/policy.yaml";
  write_text(policy, example_text());
  yolo8::test::QuotadProcess quotad;
  ASSERT_TRUE(quotad.start(policy, dir + "/quota.db", dir + "/quotad.log", {"--backup-every", "0"}));
  httplib::Client client(quotad.url());
  const int64_t lease = acquire(client, "alice-token");
  ASSERT_GT(lease, 0) << read_text(dir + "/quotad.log");
  EXPECT_EQ(team_base(client, "alice-token", "team-cv"), 8);

  // without a signal (the default check is every 5 s) nothing changes yet; SIGHUP applies it at once
  write_text(policy, edited(example_text(), "    base: 8\n", "    base: 5\n"));
  ASSERT_EQ(::kill(quotad.pid(), SIGHUP), 0);
  EXPECT_TRUE(eventually([&] { return team_base(client, "alice-token", "team-cv") == 5; }))
      << read_text(dir + "/quotad.log");
  EXPECT_EQ(post(client, "alice-token", "/v1/leases/" + std::to_string(lease) + "/heartbeat", "{}"), 200);
  EXPECT_NE(audited(client, "policy.reloaded").find("team team-cv: base 8 -> 5"), std::string::npos)
      << audited(client, "policy.reloaded");
  EXPECT_EQ(metric(client, R"(quotad_reloads_total{file="policy"})"), 1);
  EXPECT_TRUE(quotad.stop());
}

TEST(QuotadReload, ABrokenPolicyIsRefusedAndTheRunningOneKeepsServing) {
  const std::string dir = fresh_dir("broken");
  copy_memory_table(dir);
  const std::string policy = dir + "/policy.yaml";
  write_text(policy, example_text());
  yolo8::test::QuotadProcess quotad;
  ASSERT_TRUE(quotad.start(policy, dir + "/quota.db", dir + "/quotad.log", {"--backup-every", "0"}));
  httplib::Client client(quotad.url());
  const int64_t lease = acquire(client, "alice-token");
  ASSERT_GT(lease, 0);
  // a limit that breaks validation (burst below base) and, after that, a file that is not YAML
  write_text(policy, edited(example_text(), "    burst: 14\n", "    burst: 1\n"));
  ASSERT_EQ(::kill(quotad.pid(), SIGHUP), 0);
  EXPECT_TRUE(eventually([&] { return metric(client, R"(quotad_reload_failures_total{file="policy"})") == 1; }));
  write_text(policy, "teams: [\n");
  ASSERT_EQ(::kill(quotad.pid(), SIGHUP), 0);
  EXPECT_TRUE(eventually([&] { return metric(client, R"(quotad_reload_failures_total{file="policy"})") == 2; }));
  EXPECT_EQ(metric(client, R"(quotad_reloads_total{file="policy"})"), 0);
  EXPECT_EQ(team_base(client, "alice-token", "team-cv"), 8);
  EXPECT_EQ(post(client, "alice-token", "/v1/leases/" + std::to_string(lease) + "/heartbeat", "{}"), 200);
  EXPECT_GT(acquire(client, "bob-token"), 0);  // still granting
  const std::string log = read_text(dir + "/quotad.log");
  EXPECT_NE(log.find("reload refused, the running policy kept: " + policy), std::string::npos) << log;
  EXPECT_NE(audited(client, "reload.failed").find(policy), std::string::npos);
  EXPECT_TRUE(quotad.stop());
}

// Kubernetes mounts a ConfigMap as links through `..data`, which it swaps to a new directory in one rename.
TEST(QuotadReload, ASwappedDataLinkIsPickedUpWithoutASignal) {
  const std::string dir = fresh_dir("data_link");
  const std::string mount = dir + "/mount";
  fs::create_directories(mount + "/v1");
  copy_memory_table(mount + "/v1");
  write_text(mount + "/v1/policy.yaml", example_text());
  fs::create_directory_symlink("v1", mount + "/..data");
  fs::create_symlink("..data/policy.yaml", mount + "/policy.yaml");
  fs::create_symlink("..data/memory-table.yaml", mount + "/memory-table.yaml");
  yolo8::test::QuotadProcess quotad;
  ASSERT_TRUE(quotad.start(mount + "/policy.yaml", dir + "/quota.db", dir + "/quotad.log",
                           {"--backup-every", "0", "--watch-every", "1"}));
  httplib::Client client(quotad.url());
  const int64_t lease = acquire(client, "alice-token");
  ASSERT_GT(lease, 0);
  fs::create_directories(mount + "/v2");
  copy_memory_table(mount + "/v2");
  write_text(mount + "/v2/policy.yaml", edited(example_text(), "    base: 8\n", "    base: 7\n"));
  fs::create_directory_symlink("v2", mount + "/..data_tmp");
  fs::rename(mount + "/..data_tmp", mount + "/..data");  // the swap: one rename over the old link
  fs::remove_all(mount + "/v1");
  const auto swapped = std::chrono::steady_clock::now();
  EXPECT_TRUE(eventually([&] { return team_base(client, "alice-token", "team-cv") == 7; }, 4))
      << read_text(dir + "/quotad.log");
  std::printf("picked up %.1f s after the swap (--watch-every 1)\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - swapped).count());
  EXPECT_EQ(post(client, "alice-token", "/v1/leases/" + std::to_string(lease) + "/heartbeat", "{}"), 200);
  EXPECT_EQ(metric(client, R"(quotad_reloads_total{file="policy"})"), 1);
  EXPECT_TRUE(quotad.stop());
}

TEST(QuotadReload, ARotatedTokenOverlapsWithThePreviousOneUntilTheNextReload) {
  const std::string dir = fresh_dir("tokens");
  copy_memory_table(dir);
  const std::string policy = dir + "/policy.yaml";
  write_text(policy, example_text());
  const std::string tokens = dir + "/tokens.yaml";
  const std::string old_hash = sha256_hex("alice-old-token");
  const std::string new_hash = sha256_hex("alice-new-token");
  write_text(tokens, "users:\n  alice: {token_sha256: " + old_hash + "}\n");
  yolo8::test::QuotadProcess quotad;
  ASSERT_TRUE(quotad.start(policy, dir + "/quota.db", dir + "/quotad.log", {"--backup-every", "0"},
                           {"QUOTAD_TOKENS_FILE=" + tokens}))
      << read_text(dir + "/quotad.log");
  httplib::Client client(quotad.url());
  const int64_t lease = acquire(client, "alice-old-token");
  ASSERT_GT(lease, 0) << read_text(dir + "/quotad.log");
  const std::string beat = "/v1/leases/" + std::to_string(lease) + "/heartbeat";
  EXPECT_EQ(post(client, "alice-new-token", beat, "{}"), 401);

  // rotation: the new token, the old one kept beside it
  write_text(tokens, "users:\n  alice: {token_sha256: " + new_hash + ", previous_token_sha256: " + old_hash + "}\n");
  ASSERT_EQ(::kill(quotad.pid(), SIGHUP), 0);
  EXPECT_TRUE(eventually([&] { return post(client, "alice-new-token", beat, "{}") == 200; }))
      << read_text(dir + "/quotad.log");
  EXPECT_EQ(post(client, "alice-old-token", beat, "{}"), 200);
  EXPECT_NE(audited(client, "policy.reloaded").find("user alice: token replaced"), std::string::npos)
      << audited(client, "policy.reloaded");

  // the trainers have switched: the old token is dropped, the lease runs on with the new one
  write_text(tokens, "users:\n  alice: {token_sha256: " + new_hash + "}\n");
  ASSERT_EQ(::kill(quotad.pid(), SIGHUP), 0);
  EXPECT_TRUE(eventually([&] { return post(client, "alice-old-token", beat, "{}") == 401; }));
  EXPECT_EQ(post(client, "alice-new-token", beat, "{}"), 200);
  const auto got =
      client.Get(("/v1/leases/" + std::to_string(lease)).c_str(), {{"Authorization", "Bearer alice-new-token"}});
  ASSERT_TRUE(got);
  EXPECT_EQ(nlohmann::json::parse(got->body)["state"], "granted") << got->body;
  EXPECT_EQ(metric(client, R"(quotad_reloads_total{file="policy"})"), 2);
  EXPECT_EQ(metric(client, R"(quotad_reload_failures_total{file="tokens"})"), 0);

  // a tokens file naming a user the policy lacks is refused as the tokens file's fault
  write_text(tokens, "users:\n  mallory: {token_sha256: " + new_hash + "}\n");
  ASSERT_EQ(::kill(quotad.pid(), SIGHUP), 0);
  EXPECT_TRUE(eventually([&] { return metric(client, R"(quotad_reload_failures_total{file="tokens"})") == 1; }));
  EXPECT_EQ(post(client, "alice-new-token", beat, "{}"), 200);
  EXPECT_TRUE(quotad.stop());
}

// The serial (hex, as `openssl x509 -serial` prints it) of the certificate a new TLS connection is served.
std::string served_serial(int port) {
  const std::string command = "openssl s_client -connect 127.0.0.1:" + std::to_string(port) +
                              " </dev/null 2>/dev/null | openssl x509 -noout -serial 2>/dev/null";
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return "";
  char line[256] = {0};
  const bool got = std::fgets(line, sizeof line, pipe) != nullptr;
  pclose(pipe);
  std::string text = got ? line : "";
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  return text;
}

// An HTTPS call with curl against the test CA; the HTTP status, or -1.
int curl_status(const std::string& dir, int port, const std::string& method, const std::string& path,
                const std::string& token) {
  const std::string command = "curl -s -o /dev/null -w '%{http_code}' --cacert '" + dir + "/ca.pem' -X " + method +
                              " -H 'Authorization: Bearer " + token + "' -H 'Content-Type: application/json' " +
                              (method == "POST" ? "-d '{\"model\":\"yolov8s\",\"gpus\":1}' " : "") +
                              "https://127.0.0.1:" + std::to_string(port) + path;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return -1;
  char text[16] = {0};
  const bool got = std::fgets(text, sizeof text, pipe) != nullptr;
  pclose(pipe);
  return got ? std::atoi(text) : -1;
}

TEST(QuotadReload, ARenewedCertificateIsServedToNewConnectionsAndTheLeasesStay) {
  const std::string dir = fresh_dir("tls");
  copy_memory_table(dir);
  write_text(dir + "/policy.yaml", example_text());
  ASSERT_TRUE(testing::make_certificate(dir, "first", 0x1001, 20)) << read_text(dir + "/openssl.log");
  ASSERT_TRUE(testing::make_certificate(dir, "second", 0x2002, 90)) << read_text(dir + "/openssl.log");
  fs::copy_file(dir + "/first.pem", dir + "/server.pem");
  fs::copy_file(dir + "/first.key", dir + "/server.key");
  yolo8::test::QuotadProcess quotad;
  ASSERT_TRUE(
      quotad.start(dir + "/policy.yaml", dir + "/quota.db", dir + "/quotad.log",
                   {"--backup-every", "0", "--tls-cert", dir + "/server.pem", "--tls-key", dir + "/server.key"}))
      << read_text(dir + "/quotad.log");
  EXPECT_EQ(served_serial(quotad.port()), "serial=1001");
  EXPECT_EQ(curl_status(dir, quotad.port(), "POST", "/v1/leases", "alice-token"), 201);

  // the renewal as cert-manager writes it: the key first, then the certificate (a moment where they do not match)
  fs::copy_file(dir + "/second.key", dir + "/server.key", fs::copy_options::overwrite_existing);
  ASSERT_EQ(::kill(quotad.pid(), SIGHUP), 0);
  EXPECT_TRUE(
      eventually([&] { return read_text(dir + "/quotad.log").find("TLS reload refused") != std::string::npos; }));
  EXPECT_EQ(served_serial(quotad.port()), "serial=1001");  // the mismatched pair was not taken
  fs::copy_file(dir + "/second.pem", dir + "/server.pem", fs::copy_options::overwrite_existing);
  ASSERT_EQ(::kill(quotad.pid(), SIGHUP), 0);
  EXPECT_TRUE(eventually([&] { return served_serial(quotad.port()) == "serial=2002"; }))
      << read_text(dir + "/quotad.log");
  EXPECT_EQ(curl_status(dir, quotad.port(), "GET", "/v1/leases/1", "alice-token"), 200);
  EXPECT_EQ(curl_status(dir, quotad.port(), "POST", "/v1/leases/1/heartbeat", "alice-token"), 200);
  const std::string log = read_text(dir + "/quotad.log");
  EXPECT_NE(log.find("reloaded the TLS certificate " + dir + "/server.pem: serial 2002"), std::string::npos) << log;
  EXPECT_TRUE(quotad.stop());
}

TEST(QuotadReload, AnExpiredCertificateRefusesTheStartAndOneExpiringSoonWarns) {
  if (!testing::have_faketime()) GTEST_SKIP() << "faketime is not installed";
  const std::string dir = fresh_dir("expired");
  copy_memory_table(dir);
  write_text(dir + "/policy.yaml", example_text());
  ASSERT_TRUE(testing::make_certificate(dir, "expired", 7, 1, "-3 days")) << read_text(dir + "/openssl.log");
  ASSERT_TRUE(testing::make_certificate(dir, "soon", 8, 5)) << read_text(dir + "/openssl.log");
  const std::string bin = std::string(yolo8::test::kBinaryDir) + "/quota/quotad";
  const std::string run = bin + " serve --policy " + dir + "/policy.yaml --db " + dir +
                          "/quota.db --listen 127.0.0.1:0 --tls-cert " + dir + "/expired.pem --tls-key " + dir +
                          "/expired.key > " + dir + "/expired.log 2>&1";
  const int status = std::system(run.c_str());
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << status;
  const std::string refused = read_text(dir + "/expired.log");
  EXPECT_NE(refused.find("--tls-cert: '" + dir + "/expired.pem' expired (notAfter 20"), std::string::npos) << refused;

  yolo8::test::QuotadProcess quotad;
  ASSERT_TRUE(quotad.start(dir + "/policy.yaml", dir + "/quota.db", dir + "/soon.log",
                           {"--backup-every", "0", "--tls-cert", dir + "/soon.pem", "--tls-key", dir + "/soon.key"}))
      << read_text(dir + "/soon.log");
  const std::string log = read_text(dir + "/soon.log");
  EXPECT_NE(log.find("warning at start: --tls-cert '" + dir + "/soon.pem' expires in 5.0 days"), std::string::npos)
      << log;
  // the expiry on /metrics: about five days from now
  const std::string command = "curl -s --cacert '" + dir +
                              "/ca.pem' https://127.0.0.1:" + std::to_string(quotad.port()) + "/metrics > " + dir +
                              "/metrics.txt";
  ASSERT_EQ(std::system(command.c_str()), 0);
  const std::string metrics = read_text(dir + "/metrics.txt");
  const std::string series = "\nquotad_tls_certificate_expiry_timestamp_seconds ";
  const auto at = metrics.find(series);
  ASSERT_NE(at, std::string::npos) << metrics;
  const double expiry = std::stod(metrics.substr(at + series.size()));
  const double now = static_cast<double>(std::time(nullptr));
  EXPECT_NEAR(expiry - now, 5 * 86400, 120);
  EXPECT_TRUE(quotad.stop());
}

}  // namespace
}  // namespace yolo8::quota
