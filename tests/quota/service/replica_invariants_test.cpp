// Random operations across failovers: two or three quotad replicas on one PostgreSQL database, a seeded random
// sequence of API calls sent to whoever leads (following the 503's leader hint, as a trainer does), and at random
// points the leader fails (destroyed, its leadership session terminated, every session of the database terminated).
// After every step the engine's invariants hold on the replica that answered; every change acknowledged before a
// failover is in the new leader's state; no lease is lost, duplicated or moved to other GPUs by a takeover; ids
// are never reused; the audit chain verifies at the end.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "quota/service/service.h"
#include "quota/store/postgres_store.h"
#include "tests/quota/postgres_cluster.h"
#include "tests/quota/quota_test_util.h"

namespace yolo8::quota {
namespace {

using nlohmann::json;
using testing::api_call;
using testing::PostgresCluster;

const std::vector<std::pair<std::string, std::vector<std::string>>> kTeams = {
    {"team-cv", {"alice", "bob", "carol"}}, {"team-robotics", {"erin", "dave"}}, {"team-interns", {"ivan", "oscar"}}};
const std::map<std::string, std::string> kLeadOf = {
    {"team-cv", "carol"}, {"team-robotics", "dave"}, {"team-interns", "oscar"}};

// What the client was told was done: the state a later leader must still hold.
struct Acknowledged {
  struct LeaseAck {
    std::string user;
    std::string key;        // its Idempotency-Key ("" without)
    bool released = false;  // a release answered 200: ended for good
  };
  std::map<int64_t, LeaseAck> leases;
  std::map<int64_t, ApprovalState> approvals;  // kPending until a decision was answered 200
  std::map<int64_t, std::string> approval_team;
  std::map<int64_t, std::pair<std::string, LoanState>> loans;  // id -> (applicant, state answered)
  std::map<std::string, int64_t> loan_keys;                    // "user key" -> loan
  std::set<int64_t> grants;
  int64_t max_lease = 0, max_approval = 0, max_loan = 0, max_grant = 0;
};

struct Counts {
  int operations = 0, failovers = 0, refusals_followed = 0, fenced = 0, ticks_failed = 0, served_after_cut = 0;
  int releases = 0, approval_decisions = 0, loans = 0, loan_decisions = 0, grants = 0, replays = 0;
  std::map<std::string, int> failover_kinds;
  std::map<int, int> statuses;

  void add(const Counts& other) {
    operations += other.operations;
    failovers += other.failovers;
    refusals_followed += other.refusals_followed;
    fenced += other.fenced;
    ticks_failed += other.ticks_failed;
    served_after_cut += other.served_after_cut;
    releases += other.releases;
    approval_decisions += other.approval_decisions;
    loans += other.loans;
    loan_decisions += other.loan_decisions;
    grants += other.grants;
    replays += other.replays;
    for (const auto& [kind, n] : other.failover_kinds) failover_kinds[kind] += n;
    for (const auto& [status, n] : other.statuses) statuses[status] += n;
  }
};

class ReplicaRun {
 public:
  ReplicaRun(uint32_t seed, const std::string& url) : rng_(seed), order_rng_(seed + 1000), url_(url) {
    now_ = std::make_shared<std::atomic<int64_t>>(testing::kMonday + 8 * testing::kHour +
                                                  static_cast<int64_t>(pick(4)) * testing::kHour);
    const int replicas = 2 + pick(2);
    for (int i = 0; i < replicas; ++i) add_replica();
    EXPECT_TRUE(await_one_leader("the start"));
    target_ = serving_;
    leads_audited_ = leads_audited();
  }

  void run(int operations) {
    for (int op = 0; op < operations && !::testing::Test::HasFatalFailure(); ++op) {
      step_ = op;
      if (pick(100) < 4) {
        fail_leader();
      } else {
        random_operation();
      }
      ++counts_.operations;
      check_serving();
    }
  }

  // The end: one more takeover of the whole state by a replica that never led, then the audit chain.
  void finish() {
    if (::testing::Test::HasFatalFailure()) return;
    fail_leader_by("destroyed", [&] { replicas_.erase(serving_); });
    const AuditChainCheck chain = verify_audit_chain(parse_db_target(url_), StoreOptions());
    EXPECT_TRUE(chain.intact) << where() << "audit entry " << chain.broken_seq << ": " << chain.problem;
    EXPECT_EQ(chain.unchained, 0);
    // no takeover found the stored state at odds with the invariants, and every replica that led audited it
    EXPECT_EQ(PostgresCluster::query_text(url_, "SELECT COUNT(*) FROM audit WHERE action = 'state.unsound'"), "0")
        << PostgresCluster::query_text(url_,
                                       "SELECT string_agg(detail, '; ') FROM audit WHERE action = 'state.unsound'");
    EXPECT_GE(leads_audited(), counts_.failovers + 1);
    EXPECT_GT(chain.entries, 0);
  }

  const Counts& counts() const { return counts_; }

 private:
  int pick(int n) { return static_cast<int>(rng_() % static_cast<unsigned>(n)); }
  std::string where() const { return "step " + std::to_string(step_) + ": "; }

  int leads_audited() const {
    return std::stoi(PostgresCluster::query_text(url_, "SELECT COUNT(*) FROM audit WHERE action = 'replica.lead'"));
  }

  std::string add_replica() {
    const std::string address = "http://r" + std::to_string(next_replica_++) + ":8470";
    ServiceOptions options;
    options.db_path = url_;
    options.replica_address = address;
    options.store_busy_timeout_ms = 2000;
    options.store_backoff_ms = 0;  // a refused write is retried by the client at once, never in a backoff
    const auto now = now_;
    options.clock = [now] { return now->load(); };
    replicas_.emplace(address, std::make_unique<QuotaService>(testing::example_policy(), options));
    return address;
  }

  // Every live replica ticks once, in a random order, as their maintenance threads would.
  void tick_all() {
    std::vector<std::string> order;
    for (const auto& [address, replica] : replicas_) order.push_back(address);
    std::shuffle(order.begin(), order.end(), order_rng_);
    for (const std::string& address : order) tick(address);
  }
  void tick(const std::string& address) {
    try {
      replicas_.at(address)->tick();
    } catch (const std::exception&) {
      ++counts_.ticks_failed;  // quotad's tick thread logs it and ticks again a second later
    }
  }

  std::vector<std::string> ready() {
    std::vector<std::string> serving;
    for (const auto& [address, replica] : replicas_) {
      if (replica->handle(api_call("GET", "/readyz", "")).status == 200) serving.push_back(address);
    }
    return serving;
  }

  // Ticks (all replicas, or all but `skip`) until exactly one replica other than `skip` is ready; it serves.
  bool await_one_leader(const std::string& what, const std::string& skip = "") {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(15);
    for (;;) {
      std::vector<std::string> leaders = ready();
      leaders.erase(std::remove(leaders.begin(), leaders.end(), skip), leaders.end());
      if (leaders.size() == 1) {
        serving_ = leaders.front();
        return true;
      }
      EXPECT_LE(leaders.size(), 1u) << where() << what << ": two replicas serve";
      if (std::chrono::steady_clock::now() > until) {
        ADD_FAILURE() << where() << what << ": no replica took the lead within 15 s";
        return false;
      }
      std::vector<std::string> order;
      for (const auto& [address, replica] : replicas_) {
        if (address != skip) order.push_back(address);
      }
      std::shuffle(order.begin(), order.end(), order_rng_);
      for (const std::string& address : order) tick(address);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  // A call as a trainer makes it: to the replica it last reached; a 503 naming another live replica is followed
  // there, any other 503 is retried after a moment (the replicas tick meanwhile). The replica that answered serves.
  ApiResponse send(ApiRequest request) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(15);
    for (;;) {
      if (replicas_.count(target_) == 0) {
        auto it = replicas_.begin();
        std::advance(it, pick(static_cast<int>(replicas_.size())));
        target_ = it->first;
      }
      const ApiResponse response = replicas_.at(target_)->handle(request);
      if (response.status != 503) {
        serving_ = target_;
        ++counts_.statuses[response.status];
        return response;
      }
      const std::string reason = response.body.value("reason", "");
      if (reason.find("fenced") != std::string::npos) ++counts_.fenced;
      const json hint = response.body.value("leader", json());
      if (hint.is_string() && hint != target_ && replicas_.count(hint.get<std::string>()) != 0) {
        ++counts_.refusals_followed;
        target_ = hint.get<std::string>();
        continue;
      }
      if (std::chrono::steady_clock::now() > until) {
        ADD_FAILURE() << where() << request.method << " " << request.path << ": 503 for 15 s: " << response.body;
        return response;
      }
      tick_all();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  ApiResponse call(const std::string& method, const std::string& path, const std::string& user, const json& body,
                   const std::string& key = "") {
    ApiRequest request = api_call(method, path, user + "-token", body.dump());
    request.idempotency_key = key;
    return send(request);
  }

  // A new id must be above every id acknowledged before, on whichever leader it was acknowledged.
  void expect_fresh(const char* kind, int64_t id, int64_t& max) {
    EXPECT_GT(id, max) << where() << kind << " id " << id << " reused or out of order";
    max = std::max(max, id);
  }

  // `ticks` false: no clock advance (nor the replicas' ticks that come with it).
  void random_operation(bool ticks = true) {
    const int what = pick(ticks ? 96 : 84);
    if (what < 36) {
      acquire();
    } else if (what < 48) {
      release();
    } else if (what < 60) {
      heartbeats();
    } else if (what < 68) {
      decide_approval();
    } else if (what < 73) {
      apply_loan();
    } else if (what < 77) {
      decide_loan();
    } else if (what < 80) {
      grant_credits();
    } else if (what < 84) {
      replay_acquire();
    } else {
      advance_clock();
    }
  }

  void acquire() {
    const auto& [team, users] = kTeams[static_cast<size_t>(pick(3))];
    const std::string user = users[static_cast<size_t>(pick(static_cast<int>(users.size())))];
    json body{{"team", team}, {"user", user}, {"job", "job"}};
    const std::string model = pick(6) == 0 ? "yolov8l" : (pick(2) == 0 ? "yolov8n" : "yolov8s");
    body["model"] = model;
    if (model == "yolov8l") body["justification"] = "a bigger model";  // the approval tier asks for one
    int gpus = 1 + (pick(4) == 0 ? pick(3) : 0);
    body["gpus"] = gpus;
    if (pick(6) == 0) body["max_gpus"] = gpus + 2;
    const bool shared = model != "yolov8l" && gpus == 1 && pick(3) == 0;
    if (shared) {
      body["shared"] = true;
      body["memory_gib"] = 2 + pick(10);
    }
    const char* priorities[] = {"low", "normal", "high"};
    body["priority"] = priorities[pick(3)];
    if (pick(15) == 0) {
      body["priority"] = "critical";
      body["justification"] = "demo";
    }
    body["preemptible"] = pick(4) != 0;
    if (pick(10) == 0) body["node"] = "node-c";
    const std::string key = pick(2) == 0 ? "k" + std::to_string(next_key_++) : "";
    const ApiResponse response = call("POST", "/v1/leases", user, body, key);
    if (!response.body.contains("lease_id")) return;  // refused before a lease was made
    const int64_t id = response.body["lease_id"].get<int64_t>();
    EXPECT_FALSE(response.body.value("replayed", false)) << where() << "a new key replayed lease " << id;
    expect_fresh("lease", id, acked_.max_lease);
    acked_.leases[id] = {user, key, false};
    if (!key.empty()) requests_[id] = body;
    if (response.body.contains("approval_id")) {
      const int64_t approval = response.body["approval_id"].get<int64_t>();
      expect_fresh("approval", approval, acked_.max_approval);
      acked_.approvals[approval] = ApprovalState::kPending;
      acked_.approval_team[approval] = team;
    }
  }

  // The same request with the same key, later and perhaps on another leader: the same lease back.
  void replay_acquire() {
    std::vector<int64_t> keyed;
    for (const auto& [id, lease] : acked_.leases) {
      if (!lease.key.empty()) keyed.push_back(id);
    }
    if (keyed.empty()) return;
    const int64_t id = keyed[static_cast<size_t>(pick(static_cast<int>(keyed.size())))];
    const Acknowledged::LeaseAck& lease = acked_.leases.at(id);
    const ApiResponse response = call("POST", "/v1/leases", lease.user, requests_.at(id), lease.key);
    EXPECT_EQ(response.body.value("lease_id", int64_t{0}), id)
        << where() << "replay of key " << lease.key << ": " << response.body;
    EXPECT_TRUE(response.body.value("replayed", false)) << where() << response.body;
    ++counts_.replays;
  }

  int64_t random_lease(bool live_only) {
    std::vector<int64_t> ids;
    for (const auto& [id, lease] : acked_.leases) {
      if (!live_only || !lease.released) ids.push_back(id);
    }
    return ids.empty() ? 0 : ids[static_cast<size_t>(pick(static_cast<int>(ids.size())))];
  }

  void release() {
    const int64_t id = random_lease(true);
    if (id == 0) return;
    const char* outcomes[] = {"completed", "failed", "cancelled"};
    const ApiResponse response = call("POST", "/v1/leases/" + std::to_string(id) + "/release",
                                      acked_.leases.at(id).user, json{{"outcome", outcomes[pick(3)]}});
    EXPECT_EQ(response.status, 200) << where() << "release of lease " << id << ": " << response.body;
    if (response.status == 200) {
      acked_.leases.at(id).released = true;
      ++counts_.releases;
    }
  }

  void heartbeats() {
    for (const auto& [id, lease] : acked_.leases) {
      if (lease.released || pick(3) == 0) continue;
      const json telemetry{{"gpu_util", pick(101) / 100.0}, {"step", step_}};
      const ApiResponse response =
          call("POST", "/v1/leases/" + std::to_string(id) + "/heartbeat", lease.user, telemetry);
      EXPECT_EQ(response.status, 200) << where() << "heartbeat of lease " << id << ": " << response.body;
    }
    if (pick(2) == 0) {
      try {
        replicas_.at(serving_)->flush_heartbeats();
      } catch (const std::exception&) {
        ++counts_.ticks_failed;  // kept for the next round, as quotad's flusher does
      }
    }
  }

  void decide_approval() {
    std::vector<int64_t> pending;
    for (const auto& [id, state] : acked_.approvals) {
      if (state == ApprovalState::kPending) pending.push_back(id);
    }
    if (pending.empty()) return;
    const int64_t id = pending[static_cast<size_t>(pick(static_cast<int>(pending.size())))];
    const std::string lead = kLeadOf.at(acked_.approval_team.at(id));
    const bool approve = pick(3) != 0;
    // the team's lead decides unless the lead applied; an admin always may
    const std::string decider = pick(3) == 0 ? "admin" : lead;
    const ApiResponse response = call(
        "POST", "/v1/approvals/" + std::to_string(id) + (approve ? "/approve" : "/reject"), decider, json::object());
    if (response.status == 403 && decider != "admin") return;  // the lead's own request
    if (response.status == 409) return;                        // cancelled meanwhile (its lease released)
    EXPECT_EQ(response.status, 200) << where() << "decision on approval " << id << ": " << response.body;
    if (response.status == 200) {
      acked_.approvals[id] = approve ? ApprovalState::kApproved : ApprovalState::kRejected;
      ++counts_.approval_decisions;
    }
  }

  void apply_loan() {
    const auto& [team, users] = kTeams[static_cast<size_t>(pick(3))];
    const std::string user = users[static_cast<size_t>(pick(static_cast<int>(users.size())))];
    const bool retry = !acked_.loan_keys.empty() && pick(4) == 0;
    std::string key = "loan" + std::to_string(next_key_++);
    std::string applicant = user;
    if (retry) {
      auto it = acked_.loan_keys.begin();
      std::advance(it, pick(static_cast<int>(acked_.loan_keys.size())));
      applicant = it->first.substr(0, it->first.find(' '));
      key = it->first.substr(it->first.find(' ') + 1);
    }
    const ApiResponse response = call("POST", "/v1/loans", applicant,
                                      json{{"amount_gpu_hours", 1 + pick(4)}, {"justification", "a deadline"}}, key);
    if (retry) {
      EXPECT_EQ(response.status, 200) << where() << "retried loan application: " << response.body;
      EXPECT_EQ(response.body.value("id", int64_t{0}), acked_.loan_keys.at(applicant + " " + key)) << where();
      return;
    }
    if (response.status != 201) return;  // refused (over the month's cap, ...)
    const int64_t id = response.body["id"].get<int64_t>();
    expect_fresh("loan", id, acked_.max_loan);
    acked_.loans[id] = {applicant, LoanState::kPending};
    acked_.loan_keys[applicant + " " + key] = id;
    ++counts_.loans;
  }

  void decide_loan() {
    std::vector<int64_t> pending;
    for (const auto& [id, loan] : acked_.loans) {
      if (loan.second == LoanState::kPending) pending.push_back(id);
    }
    if (pending.empty()) return;
    const int64_t id = pending[static_cast<size_t>(pick(static_cast<int>(pending.size())))];
    const std::string applicant = acked_.loans.at(id).first;
    std::string team;
    for (const auto& [name, users] : kTeams) {
      if (std::find(users.begin(), users.end(), applicant) != users.end()) team = name;
    }
    const std::string decider = kLeadOf.at(team) == applicant || pick(3) == 0 ? "admin" : kLeadOf.at(team);
    const bool approve = pick(3) != 0;
    const ApiResponse response =
        call("POST", "/v1/loans/" + std::to_string(id) + (approve ? "/approve" : "/reject"), decider, json::object());
    EXPECT_EQ(response.status, 200) << where() << "decision on loan " << id << ": " << response.body;
    if (response.status == 200) {
      acked_.loans.at(id).second = approve ? LoanState::kApproved : LoanState::kRejected;
      ++counts_.loan_decisions;
    }
  }

  void grant_credits() {
    const auto& [team, users] = kTeams[static_cast<size_t>(pick(3))];
    const std::string user = users[static_cast<size_t>(pick(static_cast<int>(users.size())))];
    const std::string granter = kLeadOf.at(team) == user || pick(3) == 0 ? "admin" : kLeadOf.at(team);
    const ApiResponse response =
        call("POST", "/v1/credits", granter,
             json{{"user", user}, {"amount_gpu_hours", 1 + pick(3)}, {"reason", "a shared dataset"}});
    EXPECT_EQ(response.status, 201) << where() << "credit grant: " << response.body;
    if (response.status != 201) return;
    const int64_t id = response.body["id"].get<int64_t>();
    expect_fresh("grant", id, acked_.max_grant);
    acked_.grants.insert(id);
    ++counts_.grants;
  }

  void advance_clock() {
    now_->fetch_add(static_cast<int64_t>(pick(90)) * 1000);
    tick_all();
  }

  // The replica that answered last, or the leader when that one no longer serves (a tick stepped it down).
  const std::string& serving() {
    if (replicas_.count(serving_) == 0 ||
        replicas_.at(serving_)->handle(api_call("GET", "/readyz", "")).status != 200) {
      await_one_leader("a step down");
    }
    return serving_;
  }

  Engine snapshot(const std::string& address) {
    std::optional<Engine> copy;
    replicas_.at(address)->inspect([&](const Engine& engine) { copy.emplace(engine); });
    return std::move(*copy);
  }

  // Terminates the backends `where` selects (a condition on pg_stat_activity) and waits until they are gone, so
  // that the cut is complete before anyone ticks (pg_terminate_backend only signals them).
  void terminate_backends(const std::string& where) {
    const std::string pids = PostgresCluster::query_text(
        url_,
        "SELECT COALESCE(string_agg(pid::text, ','), '0') FROM (SELECT pid, pg_terminate_backend(pid) FROM "
        "pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() AND (" +
            where + ")) AS cut");
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (PostgresCluster::query_text(url_, "SELECT COUNT(*) FROM pg_stat_activity WHERE pid IN (" + pids + ")") !=
           "0") {
      ASSERT_LT(std::chrono::steady_clock::now(), until) << where << ": backends " << pids << " still live after 5 s";
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }

  void fail_leader() {
    switch (pick(3)) {
      case 0: fail_leader_by("destroyed", [&] { replicas_.erase(serving_); }); break;
      case 1:
        // its leadership session ends (a partition, an administrator); the process and its store's connection live
        fail_leader_by("session terminated", [&] {
          terminate_backends("pid IN (SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND objid = " +
                             std::to_string(kLeadershipLockKey & 0xffffffff) +
                             " AND database = (SELECT oid FROM pg_database WHERE datname = current_database()))");
        });
        break;
      default:
        // every session of the database ends (PostgreSQL restarted under them): stores reconnect, anyone may lead
        fail_leader_by("all sessions terminated", [&] { terminate_backends("true"); });
        break;
    }
  }

  template <typename Fail>
  void fail_leader_by(const std::string& kind, Fail fail) {
    const std::string old = serving();
    std::optional<Engine> before(snapshot(old));
    fail();
    ++counts_.failovers;
    ++counts_.failover_kinds[kind];
    const bool alive = replicas_.count(old) != 0;
    if (!alive) add_replica();  // a replacement joins as a follower
    if (alive && kind == "session terminated" && pick(3) == 0) {
      // nobody has taken over yet: the old leader's writes still land (the epoch is its own), and are carried over
      for (int i = 1 + pick(3); i > 0 && !::testing::Test::HasFatalFailure(); --i) {
        random_operation(false);
        ++counts_.operations;
        check_serving();
      }
      if (replicas_.at(old)->handle(api_call("GET", "/readyz", "")).status == 200) {
        ++counts_.served_after_cut;
        before.emplace(snapshot(old));
      }
    }
    // a leader cut off keeps serving until its tick or a write notices: sometimes a call reaches it first (a write
    // then lands or is fenced, whichever the epoch says), sometimes the others take over first
    if (alive && kind == "session terminated" && pick(2) == 0) {
      ASSERT_TRUE(await_one_leader(kind, old));
      const std::string next = serving_;
      leads_audited_ = leads_audited();
      const Engine taken_over = snapshot(next);
      expect_carried_over(*before, taken_over, kind);
      return;  // the client still calls the old leader, is refused (fenced) and follows the hint
    }
    tick_all();  // every replica notices (a cut leader only at its tick: until then it is the one ready)
    ASSERT_TRUE(await_one_leader(kind));
    // a takeover happened (by another replica, or by the same one after its session ended), and was audited
    const int leads = leads_audited();
    EXPECT_GT(leads, leads_audited_) << where() << "no replica.lead after the leader was " << kind;
    leads_audited_ = leads;
    expect_carried_over(*before, snapshot(serving_), kind);
  }

  // What the new leader holds against what the old one held when it failed: the same leases, approvals, loans and
  // grants; what had ended stays ended as it was; a lease that held GPUs and still does holds the same ones. Only
  // the new leader's first tick may have moved live leases on (expired, granted, revoked).
  void expect_carried_over(const Engine& before, const Engine& after, const std::string& kind) {
    const std::string at = where() + "after the leader was " + kind + ": ";
    for (const auto& [id, lease] : before.leases()) {
      const Lease* now = after.find(id);
      if (now == nullptr) {
        ADD_FAILURE() << at << "lease " << id << " lost";
        continue;
      }
      EXPECT_EQ(now->req.user, lease.req.user) << at << "lease " << id;
      EXPECT_EQ(now->created_ms, lease.created_ms) << at << "lease " << id;
      if (is_terminal(lease.state)) {
        EXPECT_EQ(now->state, lease.state) << at << "ended lease " << id;
        EXPECT_EQ(now->outcome, lease.outcome) << at << "ended lease " << id;
      }
      const bool held = lease.state == LeaseState::kGranted || lease.state == LeaseState::kRevoking;
      const bool holds = now->state == LeaseState::kGranted || now->state == LeaseState::kRevoking;
      if (held && holds) {
        EXPECT_EQ(now->devices, lease.devices) << at << "lease " << id << " moved GPUs";
      }
    }
    for (const auto& [id, lease] : after.leases()) {
      EXPECT_NE(before.find(id), nullptr) << at << "lease " << id << " appeared";
    }
    EXPECT_GE(after.next_lease_id(), before.next_lease_id()) << at;
    EXPECT_GE(after.next_approval_id(), before.next_approval_id()) << at;
    for (const auto& [id, approval] : before.approvals()) {
      const Approval* now = after.find_approval(id);
      if (now == nullptr) {
        ADD_FAILURE() << at << "approval " << id << " lost";
        continue;
      }
      if (approval.state != ApprovalState::kPending) {
        EXPECT_EQ(now->state, approval.state) << at << "approval " << id;
      }
    }
    EXPECT_EQ(after.approvals().size(), before.approvals().size()) << at;
    EXPECT_EQ(after.loans().size(), before.loans().size()) << at;
    for (const auto& [id, loan] : before.loans()) {
      const auto now = after.loans().find(id);
      if (now == after.loans().end()) {
        ADD_FAILURE() << at << "loan " << id << " lost";
        continue;
      }
      if (loan.state != LoanState::kPending && loan.state != LoanState::kApproved) {
        EXPECT_EQ(now->second.state, loan.state) << at << "loan " << id;
      }
    }
    EXPECT_EQ(after.grants().size(), before.grants().size()) << at;
    for (const auto& [id, grant] : before.grants()) EXPECT_EQ(after.grants().count(id), 1u) << at << "grant " << id;
  }

  // The replica that answered last: the engine's invariants, and everything acknowledged so far.
  void check_serving() {
    serving();
    const std::vector<std::string> errors = replicas_.at(serving_)->check_invariants();
    ASSERT_TRUE(errors.empty()) << where() << errors.front();
    replicas_.at(serving_)->inspect([&](const Engine& engine) {
      for (const auto& [id, ack] : acked_.leases) {
        const Lease* lease = engine.find(id);
        if (lease == nullptr) {
          ADD_FAILURE() << where() << "acknowledged lease " << id << " is not in " << serving_ << "'s state";
          continue;
        }
        EXPECT_EQ(lease->req.user, ack.user) << where() << "lease " << id;
        if (ack.released) {
          EXPECT_TRUE(is_terminal(lease->state)) << where() << "released lease " << id;
        }
      }
      for (const auto& [id, state] : acked_.approvals) {
        const Approval* approval = engine.find_approval(id);
        if (approval == nullptr) {
          ADD_FAILURE() << where() << "acknowledged approval " << id << " is not in " << serving_ << "'s state";
          continue;
        }
        if (state != ApprovalState::kPending) {
          EXPECT_EQ(approval->state, state) << where() << "approval " << id;
        }
      }
      for (const auto& [id, loan] : acked_.loans) {
        const auto it = engine.loans().find(id);
        if (it == engine.loans().end()) {
          ADD_FAILURE() << where() << "acknowledged loan " << id << " is not in " << serving_ << "'s state";
          continue;
        }
        if (loan.second == LoanState::kRejected) {
          EXPECT_EQ(it->second.state, loan.second) << where() << "loan " << id;
        }
        if (loan.second == LoanState::kApproved) {
          EXPECT_NE(it->second.state, LoanState::kPending) << where() << "loan " << id;
          EXPECT_NE(it->second.state, LoanState::kRejected) << where() << "loan " << id;
        }
      }
      for (int64_t id : acked_.grants) {
        EXPECT_EQ(engine.grants().count(id), 1u) << where() << "acknowledged grant " << id << " missing";
      }
      // nothing the client was not told of: every lease, approval, loan and grant is an acknowledged one
      for (const auto& [id, lease] : engine.leases()) {
        EXPECT_EQ(acked_.leases.count(id), 1u)
            << where() << "lease " << id << " of " << lease.req.user << " was never acknowledged";
      }
      EXPECT_EQ(engine.approvals().size(), acked_.approvals.size()) << where();
      EXPECT_EQ(engine.loans().size(), acked_.loans.size()) << where();
      EXPECT_EQ(engine.grants().size(), acked_.grants.size()) << where();
      EXPECT_GT(engine.next_lease_id(), acked_.max_lease) << where();
      EXPECT_GT(engine.next_approval_id(), acked_.max_approval) << where();
    });
  }

  std::mt19937 rng_;
  // the order of the replicas' ticks: how many rounds a takeover takes depends on timing, and must not shift rng_
  std::mt19937 order_rng_;
  std::string url_;
  std::shared_ptr<std::atomic<int64_t>> now_;
  std::map<std::string, std::unique_ptr<QuotaService>> replicas_;  // by address
  int next_replica_ = 0;
  int next_key_ = 0;
  std::string target_;   // where the client sends its next call
  std::string serving_;  // the replica that answered last (or took the lead last)
  int step_ = -1;
  int leads_audited_ = 0;  // replica.lead entries in the database after the last failover
  Acknowledged acked_;
  std::map<int64_t, json> requests_;  // the body of each keyed acquire, for its replay
  Counts counts_;
};

TEST(QuotaReplicaInvariants, RandomOperationsKeepTheInvariantsAndTheAcknowledgedStateAcrossFailovers) {
  Counts total;
  const auto started = std::chrono::steady_clock::now();
  for (uint32_t seed = 1; seed <= 6 && !HasFatalFailure(); ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    ReplicaRun run(seed, PostgresCluster::get().fresh_database("replica_invariants_" + std::to_string(seed)));
    run.run(200);
    run.finish();
    total.add(run.counts());
  }
  const auto took =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started).count();
  std::printf("%d operations, %d failovers (", total.operations, total.failovers);
  for (const auto& [kind, n] : total.failover_kinds) std::printf(" %s: %d", kind.c_str(), n);
  std::printf(
      " ) in %lld ms; %d refusals followed to the leader, %d fenced writes, %d writes served after the cut, "
      "%d failed ticks\n",
      static_cast<long long>(took), total.refusals_followed, total.fenced, total.served_after_cut, total.ticks_failed);
  std::printf("acknowledged: %d releases, %d approval decisions, %d loans, %d loan decisions, %d grants, %d replays\n",
              total.releases, total.approval_decisions, total.loans, total.loan_decisions, total.grants, total.replays);
  std::printf("statuses:");
  for (const auto& [status, n] : total.statuses) std::printf(" %d: %d", status, n);
  std::printf("\n");
  // the sequences reach every kind of failover and every kind of acknowledged change
  for (const char* kind : {"destroyed", "session terminated", "all sessions terminated"}) {
    EXPECT_GT(total.failover_kinds[kind], 0) << kind;
  }
  EXPECT_GT(total.refusals_followed, 0);
  EXPECT_GT(total.served_after_cut, 0);
  for (int n : {total.releases, total.approval_decisions, total.loans, total.loan_decisions, total.grants,
                total.replays, total.statuses[201], total.statuses[202]}) {
    EXPECT_GT(n, 0);
  }
}

}  // namespace
}  // namespace yolo8::quota
