#pragma once
// Which of several quotad replicas sharing one PostgreSQL database leads: the one holding a session-level advisory
// lock on a connection of its own. A lock rather than a leader row with a lease time: PostgreSQL frees it the moment
// the holder's session ends (a killed process, a terminated backend, and, through the TCP keepalives set below, a
// dead node within ~10 s), so no replica has to wait out a lease nor trust the clocks of the others. Taking the lead
// bumps an epoch (table quotad_leader) under the store's write lock; every write of the leader's store checks it
// (PostgresStore::fence), so a replica that lost the lead cannot change state, even one that has not noticed yet.
#include <cstdint>
#include <string>

struct pg_conn;

namespace yolo8::quota {

class PostgresLeadership {
 public:
  // `url` and `password` as for PostgresStore; `address`: where this replica serves (followers name it in their
  // 503s). Connects at once (a StoreError naming the URL when it cannot).
  PostgresLeadership(std::string url, std::string password, std::string address);
  ~PostgresLeadership();
  PostgresLeadership(const PostgresLeadership&) = delete;
  PostgresLeadership& operator=(const PostgresLeadership&) = delete;

  // One attempt to lead; it never waits for the holder. True when this replica leads (now or already), with
  // epoch() the epoch it leads in. A lost connection is made again first (a new session: the lock, if it was held,
  // is gone with the old one).
  bool try_lead(int64_t now_ms);
  // Whether this replica still leads: its session answers. False once the session is gone (the lock with it): the
  // replica must stop changing state and follow.
  bool leads();
  int64_t epoch() const { return epoch_; }
  // Gives the lead up (its lock released; the epoch stays, so the next leader's is higher).
  void resign();
  // The current leader's address as it recorded it; "" when none has led yet or the database cannot be read.
  std::string leader_address();

 private:
  void connect();
  std::string url_;
  std::string password_;
  std::string address_;
  pg_conn* conn_ = nullptr;
  bool leading_ = false;
  int64_t epoch_ = 0;
};

}  // namespace yolo8::quota
