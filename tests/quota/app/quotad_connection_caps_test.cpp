// On the real `quotad serve`: `--max-connections-per-address` raises the cap on one
// address's unauthenticated connections (the proxy case), the default holds it at 32, `--max-connections` caps
// them all; and 32 idle sockets from the trainers' shared address do not lock out a heartbeat with a valid token.
#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "tests/quota/loopback_util.h"
#include "tests/quota/quota_test_util.h"
#include "tests/quota/quotad_process.h"

namespace yolo8::quota {
namespace {

using nlohmann::json;
using testing::connect_from;

const char* kPolicy = R"(
inventory:
  nodes: [{name: box, gpus: 2, memory_gib: 24}]
emergency_pool: 0
users:
  alice: {token_sha256: 9c220f200955d76c0a38d308225e0ef10c5f971acaf2f8d1d8f732affa5bd1dc}
teams:
  t: {base: 2, burst: 2, members: [alice]}
credits: {monthly_gpu_hours: 0}
leases: {ttl_s: 6, heartbeat_interval_s: 2, expiry_grace_s: 0}
)";

// The status line quotad sent on `fd` unasked (a refusal), without waiting; "" when it sent nothing yet.
std::string refusal(int fd) {
  char head[12] = {0};
  const ssize_t n = ::recv(fd, head, sizeof(head), MSG_DONTWAIT | MSG_PEEK);
  return n == 12 ? std::string(head, 12) : "";
}

// The refusals among `fds` after quotad has had time to send them.
std::vector<std::string> refusals(const std::vector<int>& fds) {
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  std::vector<std::string> out;
  for (int fd : fds) out.push_back(refusal(fd));
  return out;
}

int count(const std::vector<std::string>& lines, const std::string& status) {
  return static_cast<int>(std::count(lines.begin(), lines.end(), "HTTP/1.1 " + status));
}

// What `request` on a fresh connection from `source` was answered: the status line ("" when nothing came back).
std::string ask_from(const std::string& source, int port, const std::string& request) {
  const int fd = connect_from(source, port);
  if (fd < 0) return "";
  timeval timeout{3, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  std::string text;
  if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL) > 0) {
    char chunk[512];
    while (text.find("\r\n") == std::string::npos) {
      const ssize_t n = ::recv(fd, chunk, sizeof(chunk), 0);
      if (n <= 0) break;
      text.append(chunk, static_cast<size_t>(n));
    }
  }
  ::close(fd);
  return text.substr(0, text.find("\r\n"));
}

class QuotadConnectionCaps : public ::testing::Test {
 protected:
  void start(const std::vector<std::string>& flags) {
    root_ = std::filesystem::path(testing::temp_db("connection_caps")).replace_extension("");
    std::filesystem::remove_all(root_);
    std::filesystem::create_directories(root_);
    std::ofstream(root_ / "policy.yaml") << kPolicy;
    ASSERT_TRUE(quotad_.start((root_ / "policy.yaml").string(), (root_ / "quota.db").string(),
                              (root_ / "quotad.log").string(), flags))
        << "see " << (root_ / "quotad.log").string();
  }
  void TearDown() override {
    for (int fd : sockets_) ::close(fd);
    EXPECT_TRUE(quotad_.stop());
  }
  // `n` idle sockets (connected, nothing sent) from `source`.
  std::vector<int> idle(const std::string& source, int n) {
    std::vector<int> fds;
    for (int i = 0; i < n; ++i) {
      fds.push_back(connect_from(source, quotad_.port()));
      EXPECT_GE(fds.back(), 0) << source << ", socket " << i + 1;
      sockets_.push_back(fds.back());
    }
    return fds;
  }

  std::filesystem::path root_;
  yolo8::test::QuotadProcess quotad_;
  std::vector<int> sockets_;
};

const std::string kHealth = "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";

// The default cap (32): a 33rd idle socket from one address makes the oldest go (429).
TEST_F(QuotadConnectionCaps, TheDefaultCapHoldsAnAddressAt32UnauthenticatedSockets) {
  start({});
  const auto first = refusals(idle("127.0.0.7", 32));
  EXPECT_EQ(count(first, "429"), 0);
  const auto after = refusals(idle("127.0.0.7", 1));
  const auto all = refusals({sockets_.begin(), sockets_.end()});
  EXPECT_EQ(count(all, "429"), 1) << "the 33rd idle socket from one address under the default cap";
  EXPECT_EQ(all.front(), "HTTP/1.1 429") << "the oldest makes room";
  EXPECT_EQ(after.front(), "");
  EXPECT_EQ(ask_from("127.0.0.8", quotad_.port(), kHealth), "HTTP/1.1 200 OK") << "another address is served";
}

TEST_F(QuotadConnectionCaps, ARaisedPerAddressCapLetsThe33rdIdleSocketIn) {
  start({"--max-connections-per-address", "40"});
  const auto all = refusals(idle("127.0.0.7", 33));
  EXPECT_EQ(count(all, "429"), 0) << "33 idle sockets under a cap of 40";
  const auto beyond = refusals(idle("127.0.0.7", 8));
  const auto now_all = refusals({sockets_.begin(), sockets_.end()});
  EXPECT_EQ(count(now_all, "429"), 1) << "41 under a cap of 40";
}

// --max-connections 20: the 21st connection from anywhere is answered 503 and closed.
TEST_F(QuotadConnectionCaps, TheGlobalCapHoldsAcrossAddresses) {
  start({"--max-connections", "20"});
  for (int i = 1; i <= 20; ++i) idle("127.0.1." + std::to_string(i), 1);
  const auto held = refusals(sockets_);
  EXPECT_EQ(count(held, "429") + count(held, "503"), 0);
  EXPECT_EQ(ask_from("127.0.2.1", quotad_.port(), kHealth).rfind("HTTP/1.1 503", 0), 0u);
  for (int fd : sockets_) ::close(fd);
  sockets_.clear();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // quotad sees them closed
  EXPECT_EQ(ask_from("127.0.2.1", quotad_.port(), kHealth), "HTTP/1.1 200 OK") << "served again below the cap";
}

// The issue's scenario: 32 idle unauthenticated sockets from the address the trainers share (the proxy's), then a
// heartbeat with a valid token on a new connection from it: answered 200, an idle socket made room.
TEST_F(QuotadConnectionCaps, ThirtyTwoIdleSocketsFromTheTrainersAddressDoNotLockOutAValidHeartbeat) {
  start({});
  httplib::Client client("127.0.0.1", quotad_.port());
  const httplib::Headers auth{{"Authorization", "Bearer alice-token"}};
  auto granted = client.Post("/v1/leases", auth, "{}", "application/json");
  ASSERT_TRUE(granted && granted->status == 201);
  const int64_t id = json::parse(granted->body)["lease_id"];
  client.stop();
  idle("127.0.0.9", 32);
  const std::string body = "{}";
  const std::string beat = "POST /v1/leases/" + std::to_string(id) +
                           "/heartbeat HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer alice-token\r\n"
                           "Content-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n" +
                           body;
  for (int i = 0; i < 5; ++i) EXPECT_EQ(ask_from("127.0.0.9", quotad_.port(), beat), "HTTP/1.1 200 OK") << i;
  // the first heartbeat's connection made the oldest idle socket go; having shown a valid token it no longer
  // counted, so the other four fit under the cap
  EXPECT_EQ(count(refusals(sockets_), "429"), 1);
}

}  // namespace
}  // namespace yolo8::quota
