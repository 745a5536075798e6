#pragma once
// A throwaway PostgreSQL 15 cluster in a temporary folder, listening only on a Unix socket in that folder, stopped
// and removed with the object. PostgreSQL refuses to run as root: as root, initdb and pg_ctl run as the `postgres`
// user Debian's package creates. Free of GoogleTest, so the benchmarks start one too (tests/quota/postgres_cluster.h
// is the tests' one per binary).
#include <libpq-fe.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <stdexcept>
#include <string>

namespace yolo8::quota::testing {

inline constexpr const char* kPostgresBin = "/usr/lib/postgresql/15/bin";
// The one role of the cluster that must give its password (create it with PASSWORD '...').
inline constexpr const char* kPasswordRole = "quotad_password";

class PostgresCluster {
 public:
  // kOff: fsync and full-page writes off, for tests, where durability is not what is checked; kOn: PostgreSQL's
  // defaults (fsync=on, synchronous_commit=on), for benchmarks, where a commit's flush is part of what is measured.
  enum class Durability { kOff, kOn };

  // Starts a cluster; throws std::runtime_error saying why it could not.
  explicit PostgresCluster(Durability durability = Durability::kOff) {
    const std::string initdb = std::string(kPostgresBin) + "/initdb";
    if (!std::filesystem::exists(initdb)) {
      throw std::runtime_error(initdb +
                               " is missing: a throwaway cluster needs PostgreSQL 15; run scripts/setup.sh (Debian's "
                               "postgresql-15 and libpq-dev)");
    }
    std::string pattern = (std::filesystem::temp_directory_path() / "yolo8-pg-XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("cannot create a folder for PostgreSQL");
    dir_ = pattern;
    if (geteuid() == 0 && std::system(("chown postgres: " + dir_.string()).c_str()) != 0) {
      throw std::runtime_error("cannot hand " + dir_.string() + " to the postgres user (run scripts/setup.sh)");
    }
    const std::string data = (dir_ / "data").string();
    const std::string log = (dir_ / "log").string();
    if (run_as_owner(initdb + " -D " + data + " -U postgres -A trust -E UTF8 --locale=C --no-sync > " + log +
                     " 2>&1") != 0) {
      throw std::runtime_error("initdb failed: see " + log);
    }
    {
      // the cluster trusts its socket's users, but kPasswordRole, whose password is checked (the store's password
      // handling); the first matching line of pg_hba.conf applies
      const std::string hba = data + "/pg_hba.conf";
      std::ifstream in(hba);
      const std::string rest((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      std::ofstream(hba) << "local all " << kPasswordRole << " scram-sha-256\n" << rest;
    }
    // only the socket in the private folder: no port to collide with
    const std::string durability_settings = durability == Durability::kOn
                                                ? " -c fsync=on -c full_page_writes=on -c synchronous_commit=on"
                                                : " -c fsync=off -c full_page_writes=off";
    if (run_as_owner(std::string(kPostgresBin) + "/pg_ctl -D " + data + " -l " + log + " -w -o \"-k " + dir_.string() +
                     " -c listen_addresses=" + durability_settings + "\" start > /dev/null") != 0) {
      throw std::runtime_error("PostgreSQL did not start: see " + log);
    }
    start_reaper();
  }

  PostgresCluster(const PostgresCluster&) = delete;
  PostgresCluster& operator=(const PostgresCluster&) = delete;

  // The cluster of this binary, started on first use; throws std::runtime_error saying why it could not start.
  static PostgresCluster& get() {
    if (instance() == nullptr) instance() = new PostgresCluster();
    return *instance();
  }
  // Stops and removes the cluster if one was started (the environment's TearDown).
  static void stop_if_started() {
    delete instance();
    instance() = nullptr;
  }

  // A new, empty database: its URL (no password: the cluster trusts its socket's users).
  std::string fresh_database(const std::string& name) {
    const std::string database = "t" + std::to_string(++databases_) + "_" + name;
    execute(url("postgres"), "CREATE DATABASE \"" + database + "\"");
    return url(database);
  }
  std::string url(const std::string& database) const {
    return "postgresql:///" + database + "?host=" + dir_.string() + "&user=postgres";
  }

  // Runs `sql` behind the store's back; a failure is thrown (std::runtime_error with PostgreSQL's message).
  static void execute(const std::string& url, const std::string& sql) { query(url, sql); }
  // The first column of the first row `sql` selects ("" when none).
  static std::string query_text(const std::string& url, const std::string& sql) { return query(url, sql); }

  ~PostgresCluster() {
    run_as_owner(std::string(kPostgresBin) + "/pg_ctl -D " + (dir_ / "data").string() +
                 " -m immediate stop > /dev/null");
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }

 private:
  static PostgresCluster*& instance() {
    static PostgresCluster* current = nullptr;
    return current;
  }

  // A test binary that crashes or is killed (a ctest timeout) runs no destructor: a detached watcher stops the
  // cluster and removes its folder once this process is gone, so no server outlives its test. After a clean end it
  // finds the folder gone and does nothing.
  void start_reaper() const {
    const std::string data = (dir_ / "data").string();
    const std::string stop = std::string(geteuid() == 0 ? "runuser -u postgres -- " : "") + kPostgresBin +
                             "/pg_ctl -D " + data + " -m immediate stop";
    const std::string script = (dir_ / "reaper.sh").string();
    std::ofstream(script) << "while kill -0 " << getpid() << " 2>/dev/null; do sleep 1; done\n"
                          << "if [ -d " << data << " ]; then " << stop << "; fi\n"
                          << "rm -rf " << dir_.string() << "\n";
    // its own session and no descriptor of ours: ctest waits for neither
    std::system(("setsid sh " + script + " < /dev/null > /dev/null 2>&1 &").c_str());
  }

  int run_as_owner(const std::string& command) const {
    // as root: the postgres user, whose shell runs the command in the cluster's folder
    return std::system(
        (geteuid() == 0 ? "cd " + dir_.string() + " && runuser -u postgres -- sh -c '" + command + "'" : command)
            .c_str());
  }

  static std::string query(const std::string& url, const std::string& sql) {
    std::unique_ptr<PGconn, void (*)(PGconn*)> conn(PQconnectdb(url.c_str()), PQfinish);
    if (PQstatus(conn.get()) != CONNECTION_OK) throw std::runtime_error(url + ": " + PQerrorMessage(conn.get()));
    std::unique_ptr<PGresult, void (*)(PGresult*)> result(PQexec(conn.get(), sql.c_str()), PQclear);
    const ExecStatusType status = PQresultStatus(result.get());
    if (status != PGRES_COMMAND_OK && status != PGRES_TUPLES_OK) {
      throw std::runtime_error(sql + ": " + PQerrorMessage(conn.get()));
    }
    return PQntuples(result.get()) > 0 && PQnfields(result.get()) > 0 ? PQgetvalue(result.get(), 0, 0) : "";
  }

  std::filesystem::path dir_;
  int databases_ = 0;
};

}  // namespace yolo8::quota::testing
