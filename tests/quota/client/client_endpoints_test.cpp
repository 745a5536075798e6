// The client against quotad's replicas: the `quota` setting lists several URLs; a follower answers a mutating
// request with 503, Retry-After and the leader's URL, which the client follows at once when it is one of the
// listed URLs; an endpoint that does not answer passes the request on to the next one; only a round in which
// every endpoint failed waits out the back-off. Heartbeats and the release follow the same way, so a takeover
// costs the lease nothing.
#include <gtest/gtest.h>

#include <chrono>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "quota/client/client.h"
#include "tests/quota/client/fake_quotad.h"

namespace yolo8::quota {
namespace {

using testing::Answer;
using testing::closed_port_url;
using testing::FakeQuotad;
using testing::http_config;
using testing::SilentListener;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// What the client said unasked, kept for the assertions (the heartbeat thread says it too).
class Notices {
 public:
  std::function<void(const std::string&)> sink() {
    return [this](const std::string& text) {
      std::lock_guard<std::mutex> lock(mutex_);
      lines_.push_back(text);
    };
  }
  std::vector<std::string> lines() {
    std::lock_guard<std::mutex> lock(mutex_);
    return lines_;
  }

 private:
  std::mutex mutex_;
  std::vector<std::string> lines_;
};

ClientConfig endpoints_config(const std::vector<std::string>& urls, Notices& notices) {
  std::string setting;
  for (const std::string& url : urls) setting += (setting.empty() ? "" : ",") + url;
  ClientConfig config = http_config(setting);
  config.on_notice = notices.sink();
  return config;
}

// The message of the std::invalid_argument `setting` is refused with ("" when it is accepted).
std::string refusal(const std::string& setting) {
  try {
    client_config_from_setting(setting);
  } catch (const std::invalid_argument& error) {
    return error.what();
  }
  return "";
}

TEST(QuotaClientEndpoints, TheSettingListsSeveralEndpoints) {
  const ClientConfig config = client_config_from_setting("https://a:8470, https://b:8470/");
  EXPECT_EQ(config.mode, "https://a:8470, https://b:8470/");
  EXPECT_EQ(parse_endpoints(config.mode), (std::vector<std::string>{"https://a:8470", "https://b:8470"}));
  EXPECT_EQ(parse_endpoints("HTTP://[::1]:8470,http://quotad-1.ns.svc:8470,http://10.0.0.7"),
            (std::vector<std::string>{"http://[::1]:8470", "http://quotad-1.ns.svc:8470", "http://10.0.0.7"}));
  Notices notices;
  const QuotaClient client(endpoints_config({"http://a:8470", "http://b:8470"}, notices));
  EXPECT_EQ(client.current_endpoint(), "http://a:8470");
}

TEST(QuotaClientEndpoints, ABadElementIsNamed) {
  for (const auto& [setting, bad] :
       std::vector<std::pair<std::string, std::string>>{{"http://a:8470,http://b:99999", "'http://b:99999'"},
                                                        {"http://a:8470,ftp://b:8470", "'ftp://b:8470'"},
                                                        {"http://a:8470,,http://b:8470", "''"},
                                                        {"http://a:8470,http://b:8470/v1", "'http://b:8470/v1'"},
                                                        {"http://a:8470,b:8470", "'b:8470'"},
                                                        {"http://a:8470,https://b:8470", "'https://b:8470'"}}) {
    SCOPED_TRACE(setting);
    const std::string message = refusal(setting);
    EXPECT_EQ(message.rfind("quota: ", 0), 0u) << message;
    EXPECT_NE(message.find(bad), std::string::npos) << message;
  }
  ClientConfig config;
  config.mode = "http://a:8470,http://b:0";
  EXPECT_THROW(QuotaClient{config}, std::invalid_argument);
}

TEST(QuotaClientEndpoints, ARepeatedEndpointIsRefused) {
  // the same quotad spelt differently: case, a trailing slash, the scheme's default port
  for (const char* setting :
       {"http://a:8470,http://a:8470", "http://a:8470,HTTP://A:8470/", "https://a,https://b,https://a:443"}) {
    SCOPED_TRACE(setting);
    EXPECT_NE(refusal(setting).find("repeats"), std::string::npos) << refusal(setting);
  }
}

TEST(QuotaClientEndpoints, ASingleUrlIsAsBefore) {
  EXPECT_EQ(client_config_from_setting("http://quotad:8470").mode, "http://quotad:8470");
  EXPECT_EQ(client_config_from_setting("https://quotad:8443/").mode, "https://quotad:8443/");
  EXPECT_EQ(parse_endpoints("https://quotad:8443/"), std::vector<std::string>{"https://quotad:8443"});
  EXPECT_EQ(normalise_endpoint("HTTPS://Quotad/"), "https://quotad:443");
  EXPECT_EQ(normalise_endpoint("http://quotad:08470"), "http://quotad:8470");
  EXPECT_EQ(normalise_endpoint("quotad:8470"), "");
  EXPECT_NE(refusal("https://").find("'https://'"), std::string::npos);
  EXPECT_NE(refusal("remote").find("is not off, local, local:PATH or an http(s):// URL"), std::string::npos);
}

// [follower, another replica, leader]: the follower's hint (spelt with a trailing slash) sends the ask straight
// to the leader, skipping the replica between them and the follower's Retry-After of 5 s.
TEST(QuotaClientEndpoints, AFollowersHintLeadsStraightToTheLeader) {
  FakeQuotad leader({});
  FakeQuotad other({});
  FakeQuotad follower({{503, 5, leader.url() + "/"}});
  Notices notices;
  QuotaClient client(endpoints_config({follower.url(), other.url(), leader.url()}, notices));
  int retries = 0;
  const auto start = Clock::now();
  const LeaseInfo lease = client.acquire(LeaseRequest{}, {}, 60, RetryHooks{[&](const RetryInfo&) { ++retries; }, {}});
  EXPECT_LT(seconds_since(start), 1.0) << "no back-off, no Retry-After wait for the hop to the leader";
  EXPECT_EQ(lease.id, 7);
  EXPECT_EQ(retries, 0);
  EXPECT_EQ(follower.asked(), 1);
  EXPECT_EQ(other.asked(), 0);
  EXPECT_EQ(leader.asked(), 1);
  EXPECT_EQ(follower.keys(), leader.keys()) << "one idempotency key across the endpoints: one lease";
  EXPECT_EQ(client.current_endpoint(), leader.url());
  EXPECT_EQ(notices.lines(), std::vector<std::string>{"quotad " + leader.url() + " is the leader now (" +
                                                      follower.url() + ": 503: not the leader)"});
  EXPECT_TRUE(client.release(Outcome::kCompleted).acknowledged);
  EXPECT_EQ(leader.releases(), 1);
  EXPECT_EQ(follower.releases(), 0);
}

TEST(QuotaClientEndpoints, AnEndpointThatIsDownPassesTheAskOn) {
  FakeQuotad live({});
  const std::string down = closed_port_url();
  Notices notices;
  QuotaClient client(endpoints_config({down, live.url()}, notices));
  int retries = 0;
  const LeaseInfo lease = client.acquire(LeaseRequest{}, {}, 60, RetryHooks{[&](const RetryInfo&) { ++retries; }, {}});
  EXPECT_EQ(lease.id, 7);
  EXPECT_EQ(retries, 0);
  EXPECT_EQ(live.asked(), 1);
  EXPECT_EQ(client.current_endpoint(), live.url());
  EXPECT_EQ(notices.lines(),
            std::vector<std::string>{"quotad " + live.url() + " answers now (" + down + ": no answer: Connection)"});
  client.release(Outcome::kCompleted);
}

// The token goes only where the setting says: a follower naming a leader outside the list is not followed there.
TEST(QuotaClientEndpoints, AHintOutsideTheListIsNotFollowed) {
  FakeQuotad stranger({});
  FakeQuotad listed({});
  FakeQuotad follower({{503, 0, stranger.url()}});
  Notices notices;
  QuotaClient client(endpoints_config({follower.url(), listed.url()}, notices));
  EXPECT_EQ(client.acquire(LeaseRequest{}).id, 7);
  EXPECT_EQ(stranger.asked(), 0);
  EXPECT_EQ(listed.asked(), 1);
  ASSERT_EQ(notices.lines().size(), 1u);
  EXPECT_NE(notices.lines()[0].find("its leader " + stranger.url() + " is not one of the quota setting's URLs"),
            std::string::npos)
      << notices.lines()[0];
  client.release(Outcome::kCompleted);

  // alone, the follower's answer is waited out as any 503 is
  FakeQuotad lone({{503, 0, stranger.url()}});
  QuotaClient single(http_config(lone.url()));
  std::vector<RetryInfo> retries;
  EXPECT_EQ(
      single.acquire(LeaseRequest{}, {}, 60, RetryHooks{[&](const RetryInfo& r) { retries.push_back(r); }, {}}).id, 7);
  EXPECT_EQ(stranger.asked(), 0);
  ASSERT_EQ(retries.size(), 1u);
  EXPECT_EQ(retries[0].reason, "not the leader") << "a follower's \"error\" says why";
  single.release(Outcome::kCompleted);
}

// [A follower hinting B, B follower hinting A]: mid-election; each is asked once a round, then the back-off.
TEST(QuotaClientEndpoints, FollowersNamingEachOtherCostOneCallEachPerRound) {
  FakeQuotad a({});
  FakeQuotad b({{503, 0, a.url()}});
  a.script_asks({{503, 0, b.url()}});
  Notices notices;
  QuotaClient client(endpoints_config({a.url(), b.url()}, notices));
  std::vector<RetryInfo> retries;
  EXPECT_EQ(
      client.acquire(LeaseRequest{}, {}, 60, RetryHooks{[&](const RetryInfo& r) { retries.push_back(r); }, {}}).id, 7);
  ASSERT_EQ(retries.size(), 1u);
  EXPECT_EQ(retries[0].attempt, 1);
  EXPECT_EQ(retries[0].reason, a.url() + ": 503: not the leader; " + b.url() + ": 503: not the leader");
  EXPECT_EQ(a.asked(), 2) << "the round after the wait starts at the first endpoint again";
  EXPECT_EQ(b.asked(), 1);
  client.release(Outcome::kCompleted);
}

// Heartbeats while the lease's quotad goes away (stopped: its port refuses; or demoted: 503 naming the leader;
// or hung: no answer within the heartbeat timeout) and another replica takes over: the beats go on there, the
// lease is never reported lost nor the fence reached, and the release goes to the new leader.
TEST(QuotaClientEndpoints, HeartbeatsAndTheReleaseMoveToTheNewLeader) {
  enum class Loss { kStopped, kDemoted, kHung };
  for (const Loss loss : {Loss::kStopped, Loss::kDemoted, Loss::kHung}) {
    SCOPED_TRACE(static_cast<int>(loss));
    // fence after 6 s without an answered beat: room for the hung case's 1 s read timeout
    FakeQuotad old_leader({}, 12, 1);
    FakeQuotad new_leader({}, 12, 1);
    Notices notices;
    QuotaClient client(endpoints_config({old_leader.url(), new_leader.url()}, notices));
    ASSERT_EQ(client.acquire(LeaseRequest{}).id, 7);
    client.start_heartbeats([] { return Telemetry{}; });
    std::this_thread::sleep_for(std::chrono::milliseconds(1200));
    EXPECT_GE(old_leader.beats(), 1);
    EXPECT_EQ(new_leader.beats(), 0);
    if (loss == Loss::kStopped) old_leader.close();
    if (loss == Loss::kDemoted) old_leader.follow(new_leader.url());
    if (loss == Loss::kHung) old_leader.hang();
    const auto moved = Clock::now();
    bool lost = false;
    bool fenced = false;
    while (seconds_since(moved) < 3.5) {
      lost = lost || client.lost();
      fenced = fenced || client.unreachable_too_long();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    EXPECT_FALSE(lost);
    EXPECT_FALSE(fenced);
    EXPECT_GE(new_leader.beats(), 2);
    EXPECT_EQ(client.current_endpoint(), new_leader.url());
    const int refused_before_release = old_leader.refused();
    const ReleaseAnswer answer = client.release(Outcome::kCompleted);
    EXPECT_TRUE(answer.acknowledged) << answer.reason;
    EXPECT_EQ(new_leader.releases(), 1);
    EXPECT_EQ(old_leader.releases(), 0);
    const std::vector<std::string> lines = notices.lines();
    ASSERT_EQ(lines.size(), 1u) << "said once, when the heartbeats moved";
    if (loss == Loss::kDemoted) {
      EXPECT_EQ(lines[0],
                "quotad " + new_leader.url() + " is the leader now (" + old_leader.url() + ": 503: not the leader)");
      EXPECT_EQ(refused_before_release, 1) << "one beat to the follower, then straight to the leader";
      EXPECT_EQ(old_leader.refused(), 1) << "the release went to the leader first";
    } else {
      EXPECT_NE(lines[0].find("quotad " + new_leader.url() + " answers now (" + old_leader.url() + ": no answer: "),
                std::string::npos)
          << lines[0];
    }
  }
}

// No endpoint answers: each round tries them all, the rounds wait out the back-off, and the deadline ends it as
// with one quotad, the message naming what each endpoint answered.
TEST(QuotaClientEndpoints, AllEndpointsDownIsUnavailableAtTheDeadline) {
  const std::string first = closed_port_url();
  FakeQuotad stalled(std::vector<Answer>(30, Answer{503}));
  Notices notices;
  ClientConfig config = endpoints_config({first, stalled.url()}, notices);
  config.unavailable_deadline_s = 1.5;
  QuotaClient client(config);
  std::vector<RetryInfo> retries;
  const auto start = Clock::now();
  try {
    client.acquire(LeaseRequest{}, {}, 60, RetryHooks{[&](const RetryInfo& r) { retries.push_back(r); }, {}});
    FAIL() << "granted by nobody";
  } catch (const QuotaUnavailable& unavailable) {
    const std::string what = unavailable.what();
    EXPECT_EQ(unavailable.status(), 503) << "the last answer's";
    EXPECT_NE(what.find("quotad unavailable for "), std::string::npos) << what;
    EXPECT_NE(what.find(first + ": no answer: Connection; " + stalled.url() + ": 503: scripted"), std::string::npos)
        << what;
  }
  const double seconds = seconds_since(start);
  EXPECT_GE(seconds, 1.5);
  EXPECT_LT(seconds, 3.0);
  ASSERT_GE(retries.size(), 3u);
  EXPECT_EQ(stalled.asked(), static_cast<int>(retries.size()) + 1) << "each endpoint once a round";
  EXPECT_LE(retries.front().retry_in_s, 0.1);
  EXPECT_LT(retries.back().give_up_in_s, retries.front().give_up_in_s);
  EXPECT_TRUE(notices.lines().empty());
}

}  // namespace
}  // namespace yolo8::quota
