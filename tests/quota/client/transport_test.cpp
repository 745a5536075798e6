// The HTTP transport's checks before a request reaches quotad: the server's TLS certificate (an expired one is
// named as such, with the URL) and the name lookup, bounded by the connect timeout.
#include "quota/client/transport.h"

#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "quota/client/client.h"
#include "tests/quota/client/fake_quotad.h"
#include "tests/quota/tls_util.h"

namespace yolo8::quota {
namespace {

using testing::FakeQuotad;
using testing::FakeTls;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

ApiRequest lease_request() {
  ApiRequest request;
  request.method = "POST";
  request.path = "/v1/leases";
  request.body = "{}";
  return request;
}

// quotad serves a certificate that expired two days ago (made under faketime): the client's reason says
// "certificate expired" and names the URL, and the lease request waits it out as unavailable (a renewal is on
// its way) until the deadline; the same CA's valid certificate is accepted.
TEST(QuotaTransport, AnExpiredCertificateIsNamedWithTheEndpoint) {
  if (!testing::have_faketime()) GTEST_SKIP() << "faketime is not installed";
  const std::string dir = ::testing::TempDir() + "/quota_transport_tls_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  ASSERT_TRUE(testing::make_certificate(dir, "expired", 7, 1, "-3 days")) << read_text(dir + "/openssl.log");
  ASSERT_TRUE(testing::make_certificate(dir, "valid", 8, 5)) << read_text(dir + "/openssl.log");

  FakeQuotad valid({}, 60, 10, {}, FakeTls{dir + "/valid.pem", dir + "/valid.key"});
  HttpOptions options;
  options.ca_file = dir + "/ca.pem";
  EXPECT_EQ(make_http_transport(valid.url(), options)->call(lease_request()).status, 201);

  FakeQuotad expired({}, 60, 10, {}, FakeTls{dir + "/expired.pem", dir + "/expired.key"});
  const ApiResponse refused = make_http_transport(expired.url(), options)->call(lease_request());
  EXPECT_EQ(refused.status, 0) << refused.body.dump();
  const std::string reason = refused.body.value("reason", "");
  EXPECT_NE(reason.find("certificate expired"), std::string::npos) << reason;
  EXPECT_NE(reason.find(expired.url()), std::string::npos) << reason;
  EXPECT_EQ(expired.asked(), 0);

  ClientConfig config;
  config.mode = expired.url();
  config.ca_file = dir + "/ca.pem";
  config.retry_initial_s = 0.1;
  config.retry_max_s = 0.2;
  config.unavailable_deadline_s = 0.5;
  QuotaClient client(config);
  std::vector<RetryInfo> retries;
  try {
    client.acquire(LeaseRequest{}, {}, 60, RetryHooks{[&](const RetryInfo& r) { retries.push_back(r); }, {}});
    FAIL() << "granted over an expired certificate";
  } catch (const QuotaUnavailable& unavailable) {
    EXPECT_NE(std::string(unavailable.what()).find("certificate expired: the TLS certificate " + expired.url()),
              std::string::npos)
        << unavailable.what();
  }
  ASSERT_FALSE(retries.empty());
  EXPECT_NE(retries.front().reason.find("certificate expired"), std::string::npos) << retries.front().reason;
  std::filesystem::remove_all(dir);
}

// A lookup that blocks until released: a DNS server that never answers. Shared with the lookup's thread, which
// outlives the test's wait.
struct HungLookup {
  std::mutex mutex;
  std::condition_variable released_signal;
  bool released = false;

  static NameLookup lookup(const std::shared_ptr<HungLookup>& hung) {
    return [hung](const std::string&) -> std::vector<std::string> {
      std::unique_lock<std::mutex> lock(hung->mutex);
      hung->released_signal.wait(lock, [&] { return hung->released; });
      throw std::runtime_error("released");
    };
  }
  void release() {
    std::lock_guard<std::mutex> lock(mutex);
    released = true;
    released_signal.notify_all();
  }
};

// The transport asks the resolver for quotad's address within the connect timeout and connects to what it got:
// a hung lookup is no answer (transient) after that timeout, not a request that hangs.
TEST(QuotaTransport, TheNameLookupIsBoundedByTheConnectTimeout) {
  FakeQuotad quotad({});
  const std::string by_name = "http://quotad.invalid:" + std::to_string(quotad.port());
  HttpOptions options;
  options.timeouts.connect_s = 0.3;
  options.resolver = std::make_shared<HostResolver>([](const std::string& host) -> std::vector<std::string> {
    if (host != "quotad.invalid") throw std::runtime_error("unknown host " + host);
    return {"127.0.0.1"};
  });
  EXPECT_EQ(make_http_transport(by_name, options)->call(lease_request()).status, 201);
  EXPECT_EQ(quotad.asked(), 1);

  const auto hung = std::make_shared<HungLookup>();
  options.resolver = std::make_shared<HostResolver>(HungLookup::lookup(hung));
  const auto start = Clock::now();
  const ApiResponse response = make_http_transport(by_name, options)->call(lease_request());
  const double seconds = seconds_since(start);
  EXPECT_EQ(response.status, 0);
  EXPECT_TRUE(is_unavailable(response.status));
  EXPECT_EQ(response.body.value("reason", ""), "name lookup of quotad.invalid failed: no answer within 0.3 s");
  EXPECT_GE(seconds, 0.3);
  EXPECT_LT(seconds, 1.0);
  hung->release();
  EXPECT_EQ(quotad.asked(), 1);
}

// A host with several addresses, the first of which refuses (127.0.0.2: the fake listens on 127.0.0.1 only): the
// call goes on to the next one at once, as httplib's own lookup would.
TEST(QuotaTransport, AnAddressThatRefusesPassesTheCallToTheHostsNext) {
  FakeQuotad quotad({});
  HttpOptions options;
  int lookups = 0;
  options.resolver = std::make_shared<HostResolver>([&](const std::string&) -> std::vector<std::string> {
    ++lookups;
    return {"127.0.0.2", "127.0.0.1"};
  });
  const auto transport = make_http_transport("http://quotad.invalid:" + std::to_string(quotad.port()), options);
  EXPECT_EQ(transport->call(lease_request()).status, 201);
  EXPECT_EQ(transport->call(lease_request()).status, 201);
  EXPECT_EQ(quotad.asked(), 2);
  EXPECT_EQ(lookups, 2) << "each call looks the host up afresh";
}

// The system's resolver end to end: quotad by the name localhost (whichever of its addresses answers).
TEST(QuotaTransport, AQuotadNamedByItsHostNameIsReached) {
  FakeQuotad quotad({});
  ClientConfig config = testing::http_config("http://localhost:" + std::to_string(quotad.port()));
  QuotaClient client(config);
  EXPECT_EQ(client.acquire(LeaseRequest{}, {}, 60).id, 7);
  EXPECT_TRUE(client.release(Outcome::kCompleted).acknowledged);
}

}  // namespace
}  // namespace yolo8::quota
