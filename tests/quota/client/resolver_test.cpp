// Name lookup with a deadline and the last good answer: a resolver that hangs or fails, as a pure unit with a
// lookup function standing in for DNS, and the system's resolver for what every machine has.
#include "quota/client/resolver.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

namespace yolo8::quota {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// A stand-in for DNS: answers `addresses`, fails when `failing`, or blocks while `hung` until released. Shared
// with the lookups' threads, which outlive a wait that gave up.
struct ScriptedDns {
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<std::string> addresses{"10.0.0.1"};
  bool failing = false;
  bool hung = false;
  int calls = 0;

  static NameLookup lookup(const std::shared_ptr<ScriptedDns>& dns) {
    return [dns](const std::string&) {
      std::unique_lock<std::mutex> lock(dns->mutex);
      ++dns->calls;
      dns->changed.wait(lock, [&] { return !dns->hung; });
      if (dns->failing) throw std::runtime_error("Name or service not known");
      return dns->addresses;
    };
  }
  void set(bool hang, bool fail, std::vector<std::string> answer = {"10.0.0.1"}) {
    std::lock_guard<std::mutex> lock(mutex);
    hung = hang;
    failing = fail;
    addresses = std::move(answer);
    changed.notify_all();
  }
  int call_count() {
    std::lock_guard<std::mutex> lock(mutex);
    return calls;
  }
};

TEST(HostResolver, AnAddressNeedsNoLookup) {
  const auto dns = std::make_shared<ScriptedDns>();
  HostResolver resolver(ScriptedDns::lookup(dns));
  EXPECT_EQ(resolver.resolve("127.0.0.1", 1).addresses, std::vector<std::string>{"127.0.0.1"});
  EXPECT_EQ(resolver.resolve("::1", 1).addresses, std::vector<std::string>{"::1"});
  EXPECT_EQ(resolver.resolve("[fd00::7]", 1).addresses, std::vector<std::string>{"[fd00::7]"});
  EXPECT_EQ(dns->call_count(), 0);
  EXPECT_TRUE(is_numeric_host("10.1.2.3"));
  EXPECT_FALSE(is_numeric_host("quotad"));
  EXPECT_FALSE(is_numeric_host("10.1.2"));
}

TEST(HostResolver, AHungLookupGivesUpAtTheDeadlineWithoutAPreviousAnswer) {
  const auto dns = std::make_shared<ScriptedDns>();
  dns->set(true, false);
  HostResolver resolver(ScriptedDns::lookup(dns));
  const auto start = Clock::now();
  const Resolved resolved = resolver.resolve("quotad", 0.2);
  EXPECT_GE(seconds_since(start), 0.2);
  EXPECT_LT(seconds_since(start), 0.8);
  EXPECT_TRUE(resolved.addresses.empty());
  EXPECT_EQ(resolved.error, "no answer within 0.2 s");
  // a second call while the first lookup still hangs waits for that one: no second thread
  EXPECT_TRUE(resolver.resolve("quotad", 0.1).addresses.empty());
  EXPECT_EQ(dns->call_count(), 1);
  dns->set(false, false);
}

TEST(HostResolver, TheLastGoodAnswerStandsInWhenALookupHangsOrFails) {
  const auto dns = std::make_shared<ScriptedDns>();
  HostResolver resolver(ScriptedDns::lookup(dns));
  const Resolved first = resolver.resolve("quotad", 1);
  EXPECT_EQ(first.addresses, std::vector<std::string>{"10.0.0.1"});
  EXPECT_FALSE(first.from_cache);

  dns->set(false, true);
  const Resolved failed = resolver.resolve("quotad", 1);
  EXPECT_EQ(failed.addresses, std::vector<std::string>{"10.0.0.1"});
  EXPECT_TRUE(failed.from_cache);
  EXPECT_EQ(failed.error, "Name or service not known");

  dns->set(true, false);
  const auto start = Clock::now();
  const Resolved late = resolver.resolve("quotad", 0.2);
  EXPECT_LT(seconds_since(start), 0.8);
  EXPECT_EQ(late.addresses, std::vector<std::string>{"10.0.0.1"});
  EXPECT_TRUE(late.from_cache);
  // another host has no answer to fall back to
  EXPECT_TRUE(resolver.resolve("other", 0.1).addresses.empty());

  // once DNS answers again, a changed address is taken
  dns->set(false, false, {"10.0.0.2", "fd00::2"});
  Resolved changed = resolver.resolve("quotad", 1);  // the hung lookup's late answer
  changed = resolver.resolve("quotad", 1);
  EXPECT_EQ(changed.addresses, (std::vector<std::string>{"10.0.0.2", "fd00::2"}));
  EXPECT_FALSE(changed.from_cache);
}

TEST(HostResolver, TheSystemResolverFindsLocalhostAndNotAnInvalidName) {
  const std::vector<std::string> local = system_lookup("localhost");
  ASSERT_FALSE(local.empty());
  for (const std::string& address : local) EXPECT_TRUE(address == "127.0.0.1" || address == "::1") << address;
  EXPECT_THROW(system_lookup("no-such-host.invalid"), std::runtime_error);
}

}  // namespace
}  // namespace yolo8::quota
