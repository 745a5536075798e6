// /metrics of a serving quotad (QuotaServer on 127.0.0.1) with whole, shared and emergency leases, checked by
// Prometheus' own linter (`promtool check metrics`), and its GPU figures against the leases.
#include <httplib.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "quota/server/http_server.h"
#include "tests/quota/server/activity_util.h"

namespace yolo8::quota {
namespace {

bool have_promtool() { return std::system("command -v promtool >/dev/null 2>&1") == 0; }

// Runs `command`, returns its exit status and fills `output` with stdout and stderr.
int run(const std::string& command, std::string& output) {
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return -1;
  char buffer[4096];
  size_t read = 0;
  while ((read = fread(buffer, 1, sizeof buffer, pipe)) > 0) output.append(buffer, read);
  const int status = pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(QuotadMetricsLive, PromtoolAcceptsTheExpositionAndTheGpusAddUp) {
  if (!have_promtool()) {
    GTEST_SKIP() << "promtool is not installed (Debian package `prometheus`; scripts/setup.sh installs it)";
  }
  testing::ScriptedHistory h;
  h.run();
  ASSERT_TRUE(testing::add_shared_and_emergency(h));
  QuotaServer server(*h.service, ServerOptions{});
  const int port = server.start();
  httplib::Client client("127.0.0.1", port);
  const auto first = client.Get("/metrics");
  const auto response = client.Get("/metrics");  // a second scrape: histograms kept, nothing counted twice
  server.stop();
  ASSERT_TRUE(first && response);
  ASSERT_EQ(response->status, 200);
  EXPECT_EQ(response->get_header_value("Content-Type").rfind("text/plain; version=0.0.4", 0), 0u)
      << response->get_header_value("Content-Type");

  const std::string dir = std::string(yolo8::test::kBinaryDir) + "/quota_test_tmp";
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/metrics_" + std::to_string(::getpid()) + ".txt";
  std::ofstream(path) << response->body;
  std::string lint;
  const int rc = run("promtool check metrics < " + path, lint);
  EXPECT_EQ(rc, 0) << "promtool check metrics " << path << ":\n" << lint;
  EXPECT_EQ(lint, "") << lint;

  const auto m = testing::parse_samples(response->body);
  const double held = 4 + 6 + 1 + 3;  // alice, erin, the GPU of bob's shared lease (whole), dave's emergency lease
  EXPECT_DOUBLE_EQ(m.at("quotad_gpus_allocated"), held);
  EXPECT_DOUBLE_EQ(m.at("quotad_gpus_allocated") + m.at("quotad_gpus_free"), m.at("quotad_gpus"));
  EXPECT_DOUBLE_EQ(m.at("quotad_emergency_gpus_allocated"), 3);
  double leases = 0;
  for (const auto& [key, value] : m) {
    if (key.rfind("quotad_lease_gpus{", 0) == 0) leases += value;
  }
  // the leases' own figures bill bob's memory share; the allocation counts his GPU whole (nobody else can use it)
  EXPECT_DOUBLE_EQ(leases, held - 1 + 4.0 / 80);
  EXPECT_EQ(m.at("quotad_queue_wait_seconds_count"), 5);  // 3 + bob + dave, once each over two scrapes
}

TEST(QuotadMetricsLive, PromtoolRejectsTheOldNames) {
  if (!have_promtool()) GTEST_SKIP() << "promtool is not installed (Debian package `prometheus`)";
  // the check above can fail: names once shipped by mistake are refused by the same command
  const std::string dir = std::string(yolo8::test::kBinaryDir) + "/quota_test_tmp";
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/old_metrics_" + std::to_string(::getpid()) + ".txt";
  std::ofstream(path) << "# HELP quotad_gpus_total GPUs in the inventory.\n# TYPE quotad_gpus_total gauge\n"
                         "quotad_gpus_total 20\n";
  std::string lint;
  EXPECT_NE(run("promtool check metrics < " + path, lint), 0);
  EXPECT_NE(lint.find("non-counter metrics should not have \"_total\" suffix"), std::string::npos) << lint;
}

}  // namespace
}  // namespace yolo8::quota
