#include "quota/service/router.h"

#include <gtest/gtest.h>

#include <string>

#include "quota/service/service.h"
#include "tests/quota/quota_test_util.h"

namespace yolo8::quota {
namespace {

using testing::api_call;

// Answers every token route as the admin; counts how often it was asked.
struct CountingAuthenticate {
  int* calls;
  std::variant<Caller, ApiResponse> operator()(const ApiRequest&) const {
    ++*calls;
    return Caller{"admin", "", Role::kAdmin};
  }
};

class RouterTest : public ::testing::Test {
 protected:
  QuotaService service_{testing::example_policy(), ServiceOptions{}};
  int calls_ = 0;
  ApiResponse dispatch(const std::string& method, const std::string& path, const std::string& body = "") {
    return Router::dispatch(service_, api_call(method, path, "", body), CountingAuthenticate{&calls_});
  }
};

TEST_F(RouterTest, AnUnknownPathIs404BeforeAnyoneIsAsked) {
  for (const char* path : {"/v1/nothing", "/v1/leases/1/heartbeat/x", "/", "/status", "/metrics"}) {
    const ApiResponse answer = dispatch("GET", path);
    EXPECT_EQ(answer.status, 404) << path;  // the pages are the HTTP front's
    EXPECT_EQ(answer.headers.count("Allow"), 0u) << path;
  }
  EXPECT_EQ(calls_, 0);
}

TEST_F(RouterTest, AWrongMethodIs405WithAllowBeforeAnyoneIsAsked) {
  const ApiResponse leases = dispatch("DELETE", "/v1/leases");
  EXPECT_EQ(leases.status, 405);
  EXPECT_EQ(leases.headers.at("Allow"), "GET, POST");
  const ApiResponse heartbeat = dispatch("GET", "/v1/leases/7/heartbeat");
  EXPECT_EQ(heartbeat.status, 405);
  EXPECT_EQ(heartbeat.headers.at("Allow"), "POST");
  EXPECT_EQ(calls_, 0);
}

TEST_F(RouterTest, OpenRoutesNeedNoCallerAndTokenRoutesAskOnce) {
  const ApiResponse health = dispatch("GET", "/healthz");
  EXPECT_EQ(health.status, 200);
  EXPECT_EQ(health.body["status"], "ok");
  EXPECT_EQ(calls_, 0);
  EXPECT_EQ(dispatch("GET", "/v1/teams").status, 200);
  EXPECT_EQ(calls_, 1);
}

// Readiness is open and in the fast lane like liveness, and reports this process's mode as its role.
TEST_F(RouterTest, ReadyzAnswersWithoutACallerAndNamesTheRole) {
  const ApiResponse ready = dispatch("GET", "/readyz");
  EXPECT_EQ(ready.status, 200);
  EXPECT_EQ(ready.body["ready"], true);
  EXPECT_EQ(ready.body["role"], "memory");
  EXPECT_FALSE(ready.body.contains("leader"));
  EXPECT_EQ(ready.headers.count("Retry-After"), 0u);
  EXPECT_EQ(calls_, 0);
  EXPECT_EQ(Router::match("GET", "/readyz").lane(), RouteLane::kFast);
  const ApiResponse post = dispatch("POST", "/readyz");
  EXPECT_EQ(post.status, 405);
  EXPECT_EQ(post.headers.at("Allow"), "GET");
}

TEST(RouterReadiness, EveryModeThatServesTheStateIsReady) {
  const std::string db = testing::temp_db("router_readyz");
  for (const bool local : {false, true}) {
    ServiceOptions options;
    options.db_path = db;
    options.reload_per_call = local;
    QuotaService service(testing::example_policy(), options);
    const ApiResponse ready = Router::dispatch(service, api_call("GET", "/readyz", ""),
                                               [](const ApiRequest&) -> std::variant<Caller, ApiResponse> {
                                                 return error_response(401, "no caller for an open route");
                                               });
    EXPECT_EQ(ready.status, 200) << local;
    EXPECT_EQ(ready.body["ready"], true) << local;
    EXPECT_EQ(ready.body["role"], local ? "local" : "single");
  }
  for (const EngineMode mode : {EngineMode::kMemory, EngineMode::kSingle, EngineMode::kLocal}) {
    EXPECT_TRUE(serves_state(mode)) << to_string(mode);
  }
}

// A process that does not serve the state (a follower) is taken out of the Service's endpoints: 503, with
// Retry-After, naming the leader; /healthz keeps answering it alive.
TEST(RouterReadiness, AProcessThatDoesNotServeTheStateIs503NamingTheLeader) {
  const ApiResponse follower = readiness_answer(false, "follower", "https://quotad-1:8470");
  EXPECT_EQ(follower.status, 503);
  EXPECT_FALSE(follower.headers.at("Retry-After").empty());
  EXPECT_EQ(follower.body["ready"], false);
  EXPECT_EQ(follower.body["role"], "follower");
  EXPECT_EQ(follower.body["leader"], "https://quotad-1:8470");
  const ApiResponse electing = readiness_answer(false, "follower", "");
  EXPECT_EQ(electing.status, 503);
  EXPECT_TRUE(electing.body.at("leader").is_null());
  const ApiResponse leader = readiness_answer(true, "single", "");
  EXPECT_EQ(leader.status, 200);
  EXPECT_EQ(leader.body["ready"], true);
}

TEST_F(RouterTest, ARefusalFromTheGateIsTheAnswer) {
  const ApiResponse answer = Router::dispatch(
      service_, api_call("GET", "/v1/teams", ""),
      [](const ApiRequest&) -> std::variant<Caller, ApiResponse> { return error_response(401, "no"); });
  EXPECT_EQ(answer.status, 401);
}

TEST_F(RouterTest, AMalformedIdIs404AfterTheCallerIsKnown) {
  for (const char* id : {"abc", "-1", "0", "12abc", "1234567890123456"}) {
    const ApiResponse answer = dispatch("GET", std::string("/v1/leases/") + id);
    EXPECT_EQ(answer.status, 404) << id;
    EXPECT_EQ(answer.body["reason"], "unknown lease: ids are positive numbers") << id;
  }
  EXPECT_EQ(calls_, 5);
  EXPECT_EQ(dispatch("GET", "/v1/leases/99").body["reason"], "unknown lease 99");
}

TEST(RouterTable, MatchesSegmentBySegment) {
  const RouteMatch heartbeat = Router::match("POST", "/v1/leases/12/heartbeat");
  ASSERT_TRUE(heartbeat.found());
  EXPECT_EQ(Router::routes()[static_cast<size_t>(heartbeat.index)].pattern, "/v1/leases/{id}/heartbeat");
  EXPECT_EQ(heartbeat.lane(), RouteLane::kFast);
  EXPECT_FALSE(Router::match("POST", "/v1/leases/12/heartbeat/").allowed.empty());  // a trailing slash is the same
  EXPECT_TRUE(Router::match("POST", "/v1/leases/12/13/heartbeat").allowed.empty());
  EXPECT_EQ(Router::split_path("//v1//leases/3/"), (Router::Parts{"v1", "leases", "3"}));
  int64_t id = 0;
  EXPECT_TRUE(Router::parse_id("42", id));
  EXPECT_EQ(id, 42);
  EXPECT_FALSE(Router::parse_id("+42", id));
}

}  // namespace
}  // namespace yolo8::quota
