// quotad: the GPU lease service (serve) and its admin verbs, which talk to a running server.
#include <httplib.h>
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <utility>
#include <vector>

#include "quota/core/calendar.h"
#include "quota/core/memory_learning.h"
#include "quota/core/policy.h"
#include "quota/core/recommend.h"
#include "quota/core/sha256.h"
#include "quota/server/history.h"
#include "quota/server/http_server.h"
#include "quota/server/k8s_render.h"
#include "quota/server/report.h"
#include "quota/server/statement.h"
#include "quota/server/tls_credentials.h"
#include "quota/service/service.h"
#include "quota/store/store.h"
#include "quota/store/writer_lock.h"

using nlohmann::json;
using namespace yolo8::quota;

namespace {

constexpr const char* kIsoUtc = "%Y-%m-%dT%H:%M:%SZ";  // a certificate's notAfter, as openssl prints it

struct AdminArgs {
  std::string server = "http://127.0.0.1:8470";
  std::string token;
  bool raw_json = false;
};

json admin_call(const AdminArgs& args, const std::string& method, const std::string& path,
                const std::string& body = "") {
  httplib::Client cli(args.server);
  cli.set_connection_timeout(5, 0);
  cli.set_read_timeout(10, 0);
  httplib::Headers headers;
  std::string token = args.token;
  if (token.empty()) {
    if (const char* env_token = std::getenv("QUOTAD_TOKEN")) token = env_token;
  }
  if (!token.empty()) headers.emplace("Authorization", "Bearer " + token);
  auto res =
      method == "GET" ? cli.Get(path.c_str(), headers) : cli.Post(path.c_str(), headers, body, "application/json");
  if (!res) throw std::runtime_error("cannot reach " + args.server + ": " + httplib::to_string(res.error()));
  json reply;
  try {
    reply = json::parse(res->body);
  } catch (const json::exception&) {
    reply = json{{"reason", res->body}};
  }
  if (res->status >= 400) {
    throw std::runtime_error("HTTP " + std::to_string(res->status) + ": " + reply.value("reason", res->body));
  }
  return reply;
}

// A command's output: to `path`, or to stdout when it is empty. Throws naming the file it could not write.
void write_output(const std::string& path, const std::string& text) {
  if (path.empty()) {
    std::fwrite(text.data(), 1, text.size(), stdout);
    return;
  }
  std::ofstream out(path, std::ios::binary);
  out << text;
  if (!out) throw std::runtime_error(path + ": cannot write");
}

std::string fmt_ms(int64_t ms) {
  if (ms <= 0) return "-";
  const time_t seconds = static_cast<time_t>(ms / 1000);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%d %H:%M:%S", std::gmtime(&seconds));
  return text;
}

// The token hashes come from $QUOTAD_TOKENS_FILE (the Secret the deployment mounts) when it is set.
Policy load_policy_with_tokens(const std::string& policy_path) {
  const char* tokens = std::getenv("QUOTAD_TOKENS_FILE");
  return load_policy(policy_path, tokens != nullptr ? tokens : "");
}

// The content's digest of a file as a path reaches it now (symlinks followed: Kubernetes swaps a `..data` link
// over the mounted files of a ConfigMap or Secret); "" when it cannot be read.
std::string fingerprint(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return sha256_hex(text);
}

constexpr int64_t kCertificateWarnMs = 14 * 86400 * 1000LL;

// Refuses an expired certificate, warns of one expiring within 14 days; `when`: "at start" or "on reload".
void check_certificate(const CertificateFacts& facts, const std::string& cert_file, const char* when) {
  const int64_t now = system_now_ms();
  switch (certificate_state(facts.not_after_ms, now, kCertificateWarnMs)) {
    case CertificateState::kExpired:
      throw std::runtime_error("--tls-cert: '" + cert_file + "' expired (notAfter " +
                               utc_text(facts.not_after_ms, kIsoUtc) + "); renew it");
    case CertificateState::kExpiresSoon:
      std::fprintf(stderr, "quotad: warning %s: --tls-cert '%s' expires in %.1f days (notAfter %s); renew it\n", when,
                   cert_file.c_str(), static_cast<double>(facts.not_after_ms - now) / 86400000.0,
                   utc_text(facts.not_after_ms, kIsoUtc).c_str());
      break;
    case CertificateState::kValid: break;
  }
}

// What quotad's upkeep adds to /metrics: reloads applied and refused by file, the served certificate's notAfter.
class Upkeep {
 public:
  void watch(const std::string& kind) {
    std::lock_guard<std::mutex> lock(mutex_);
    figures_.reloads[kind] += 0;
    figures_.reload_failures[kind] += 0;
  }
  void applied(const std::string& kind) {
    std::lock_guard<std::mutex> lock(mutex_);
    ++figures_.reloads[kind];
  }
  void refused(const std::string& kind) {
    std::lock_guard<std::mutex> lock(mutex_);
    ++figures_.reload_failures[kind];
  }
  void certificate(int64_t not_after_ms) {
    std::lock_guard<std::mutex> lock(mutex_);
    figures_.certificate_not_after_ms = not_after_ms;
  }
  OperationsFigures figures() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return figures_;
  }

 private:
  mutable std::mutex mutex_;
  OperationsFigures figures_;
};

// The SQLite file `--db` names, for what only SQLite has; a PostgreSQL database is refused with what to use instead.
std::string sqlite_only(const std::string& db, const std::string& command, const std::string& instead) {
  const DbTarget target = parse_db_target(db);
  if (target.kind == DbTarget::Kind::kPostgres) {
    throw std::runtime_error(command + ": --db names a PostgreSQL database: " + instead +
                             " (see 'PostgreSQL' in quota/README.md)");
  }
  return target.location;
}

int serve(const std::string& policy_path, const std::string& db, const std::string& db_password_file,
          const std::string& listen, bool full_sync, int threads, const std::string& tls_cert,
          const std::string& tls_key, int backup_every_min, int backup_keep, int max_connections_per_address,
          int max_connections, int watch_every_s, bool init, const std::string& advertise,
          int heartbeat_retention_days) {
  const DbTarget target = parse_db_target(db);  // before anything starts: a URL with a password is refused
  const bool sqlite = target.kind == DbTarget::Kind::kSqlite;
  if (!sqlite && backup_every_min > 0) {
    std::printf(
        "quotad: %s is backed up by PostgreSQL's own means (pg_dump, continuous archiving): --backup-every "
        "does not apply\n",
        db.c_str());
    backup_every_min = 0;
  }
  const char* tokens_env = std::getenv("QUOTAD_TOKENS_FILE");
  const std::string tokens_path = tokens_env != nullptr ? tokens_env : "";
  Policy policy = load_policy(policy_path, tokens_path);
  auto upkeep = std::make_shared<Upkeep>();
  upkeep->watch("policy");
  if (!tokens_path.empty()) upkeep->watch("tokens");
  if (!tls_cert.empty()) {
    // before anything is opened: an expired certificate would only fail every trainer's handshake
    check_certificate(TlsCredentials::load(tls_cert, tls_key)->facts(), tls_cert, "at start");
    upkeep->watch("tls");
  }
  // Before the database is opened: a second quotad on it would expire the first one's leases under it.
  std::optional<WriterLock> writer;
  if (sqlite) writer.emplace(target.location);
  // never an empty database in place of one whose backups lie beside it, unless asked for
  if (sqlite) prepare_database(target.location, init, system_now_ms());
  ServerOptions so;
  parse_listen(listen, so.host, so.port);
  so.threads = threads;
  so.max_connections_per_client = max_connections_per_address;
  so.max_connections = max_connections;
  so.tls_cert_file = tls_cert;
  so.tls_key_file = tls_key;
  so.operations = [file = target.location, backup_every_min, upkeep] {
    OperationsFigures ops = upkeep->figures();
    ops.backup_interval_ms = int64_t{backup_every_min} * 60000;
    if (ops.backup_interval_ms > 0) ops.newest_backup_ms = newest_backup_ms(file);  // a directory listing per scrape
    return ops;
  };
  ServiceOptions opts;
  opts.db_path = db;
  opts.db_password_file = db_password_file;
  if (!sqlite) {
    // what a follower's 503 names: the URL trainers reach this replica at
    char host[256] = {};
    gethostname(host, sizeof host - 1);
    // with port 0 the port is known only once serving: nothing to name then without --advertise
    opts.replica_address = !advertise.empty() ? advertise
                           : so.port == 0     ? std::string()
                                              : std::string(tls_cert.empty() ? "http" : "https") + "://" + host + ":" +
                                                std::to_string(so.port);
  }
  opts.full_sync = full_sync;
  // a state change waits at most 2 s for SQLite (another process holding the lock, a slow disk), then 503;
  // for a second after that, changes get 503 at once
  opts.store_busy_timeout_ms = 2000;
  opts.outage_after_ms = 3000;  // the maintenance thread ticks every second
  opts.heartbeat_retention_ms = int64_t{heartbeat_retention_days} * 86400000;
  // block the stop and reload signals in every thread; the main thread waits for them
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  QuotaService service(std::move(policy), opts);
  QuotaServer server(service, so);
  const int port = server.start();
  if (const auto credentials = server.tls_credentials()) upkeep->certificate(credentials->facts().not_after_ms);
  std::printf("quotad: serving %s (%d GPUs, %zu teams) on %s://%s:%d, db %s\n", policy_path.c_str(),
              service.policy().total_gpus(), service.policy().teams.size(), tls_cert.empty() ? "http" : "https",
              so.host.c_str(), port, db.c_str());
  std::fflush(stdout);
  const PeriodicBackup backups(target.location, backup_every_min, backup_keep);  // online copies beside a SQLite file

  // SIGHUP reloads every watched file; without it, a file whose content changed (checked every watch_every_s)
  // is reloaded. A file is tried once per content: a broken one is not retried until it changes or SIGHUP.
  std::vector<std::string> watched = {policy_path};
  if (!tokens_path.empty()) watched.push_back(tokens_path);
  if (!tls_cert.empty()) watched.insert(watched.end(), {tls_cert, tls_key});
  std::map<std::string, std::string> seen;
  for (const auto& path : watched) seen[path] = fingerprint(path);
  auto changed = [&](const std::string& path) {
    if (path.empty()) return false;
    const std::string now = fingerprint(path);
    return now != std::exchange(seen[path], now);
  };
  auto reload_policy = [&](const std::string& kind) {
    try {
      const std::string summary = service.reload_policy(load_policy(policy_path, tokens_path));
      upkeep->applied(kind);
      std::fprintf(stderr, "quotad: reloaded %s%s: %s\n", policy_path.c_str(),
                   tokens_path.empty() ? "" : (" and " + tokens_path).c_str(),
                   summary.empty() ? "no change to teams, users or limits" : summary.c_str());
    } catch (const std::exception& error) {
      std::string message = error.what();
      const bool names_tokens = !tokens_path.empty() && message.rfind(tokens_path, 0) == 0;
      if (!names_tokens && message.rfind(policy_path, 0) != 0) message = policy_path + ": " + message;
      const std::string file = names_tokens ? "tokens" : "policy";
      upkeep->refused(file);
      std::fprintf(stderr, "quotad: reload refused, the running policy kept: %s\n", message.c_str());
      service.audit_note("reload.failed", message);
    }
  };
  auto reload_tls = [&] {
    try {
      const CertificateFacts facts = [&] {
        // checked before it is served: an expired renewal keeps the running certificate
        check_certificate(TlsCredentials::load(tls_cert, tls_key)->facts(), tls_cert, "on reload");
        return server.reload_tls();
      }();
      upkeep->applied("tls");
      upkeep->certificate(facts.not_after_ms);
      const std::string detail = tls_cert + ": serial " + facts.serial + ", subject " + facts.subject + ", notAfter " +
                                 utc_text(facts.not_after_ms, kIsoUtc);
      std::fprintf(stderr, "quotad: reloaded the TLS certificate %s\n", detail.c_str());
      service.audit_note("tls.reloaded", detail);
    } catch (const std::exception& error) {
      upkeep->refused("tls");
      std::fprintf(stderr, "quotad: TLS reload refused, the running certificate kept: %s\n", error.what());
      service.audit_note("reload.failed", error.what());
    }
  };
  int sig = 0;
  while (true) {
    if (watch_every_s > 0) {
      const timespec timeout{watch_every_s, 0};
      sig = sigtimedwait(&set, nullptr, &timeout);
    } else {
      sigwait(&set, &sig);
    }
    if (sig == SIGINT || sig == SIGTERM) break;
    const bool forced = sig == SIGHUP;
    if (forced) std::fprintf(stderr, "quotad: SIGHUP: reloading the policy%s\n", tls_cert.empty() ? "" : " and TLS");
    const bool policy_changed = changed(policy_path);
    const bool tokens_changed = changed(tokens_path);
    if (forced || policy_changed || tokens_changed) reload_policy(policy_changed || forced ? "policy" : "tokens");
    const bool cert_changed = changed(tls_cert);
    const bool key_changed = changed(tls_key);
    if (!tls_cert.empty() && (forced || cert_changed || key_changed)) reload_tls();
  }
  std::printf("quotad: signal %d, stopping\n", sig);
  server.stop();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"quotad: GPU leases with department quotas"};
  app.require_subcommand(1);

  std::string policy_path = "configs/quota-policy.yaml", db = "quotad.db", db_password_file, listen = "127.0.0.1:8470";
  bool full_sync = false;
  int threads = 64;
  auto* serve_cmd = app.add_subcommand("serve", "run the service");
  serve_cmd->add_option("--policy", policy_path, "policy YAML")->capture_default_str();
  serve_cmd
      ->add_option("--db", db,
                   "the database: a SQLite file (PATH or sqlite:PATH, created if missing, unless backups of one lie "
                   "beside it) or a PostgreSQL URL "
                   "(postgresql://USER@HOST/DB, no password in it)")
      ->capture_default_str();
  serve_cmd->add_option("--db-password-file", db_password_file,
                        "PostgreSQL: a file whose first line is the password (else libpq's PGPASSWORD / PGPASSFILE)");
  std::string advertise;
  serve_cmd->add_option("--advertise", advertise,
                        "PostgreSQL replicas: the URL trainers reach this replica at, which the others name while it "
                        "leads (default: http(s)://HOSTNAME:PORT)");
  bool init_db = false;
  serve_cmd->add_flag("--init", init_db,
                      "SQLite: create a missing --db even where backups of one lie beside it (its ids start above "
                      "theirs)");
  serve_cmd->add_option("--listen", listen, "HOST:PORT (port 0 picks a free one)")->capture_default_str();
  serve_cmd->add_flag("--sync-full", full_sync, "fsync every commit (survives power loss; slower)");
  serve_cmd->add_option("--threads", threads, "HTTP worker threads")->check(CLI::Range(2, 1024));
  int backup_every_min = 60, backup_keep = 24;
  serve_cmd->add_option("--backup-every", backup_every_min, "minutes between online backups of --db (0: none)")
      ->check(CLI::Range(0, 10080))
      ->capture_default_str();
  serve_cmd->add_option("--backup-keep", backup_keep, "online backups kept (the newest)")
      ->check(CLI::Range(1, 10000))
      ->capture_default_str();
  int heartbeat_retention_days = 14;
  serve_cmd
      ->add_option("--heartbeat-retention-days", heartbeat_retention_days,
                   "days raw heartbeats are kept (each hour is summed up per lease once over; the reports and a "
                   "restart read the sums)")
      ->check(CLI::Range(1, 36500))
      ->capture_default_str();
  // connections that have not yet presented a valid token, per peer address; behind a TLS proxy or a NAT
  // every trainer shares one address (quota/README.md, threat model)
  int max_connections_per_address = ServerOptions{}.max_connections_per_client;
  int max_connections = ServerOptions{}.max_connections;
  serve_cmd
      ->add_option("--max-connections-per-address", max_connections_per_address,
                   "unauthenticated connections per peer address (the oldest idle one is closed, 429)")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  serve_cmd->add_option("--max-connections", max_connections, "open connections in all (more get 503)")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  int watch_every_s = 5;
  serve_cmd
      ->add_option("--watch-every", watch_every_s,
                   "seconds between checks of the policy, $QUOTAD_TOKENS_FILE and the TLS files for a changed content, "
                   "reloaded as on SIGHUP (0: on SIGHUP only)")
      ->check(CLI::Range(0, 3600))
      ->capture_default_str();
  std::string tls_cert, tls_key;
  auto* cert_option = serve_cmd->add_option("--tls-cert", tls_cert, "serve HTTPS with this PEM certificate (chain)")
                          ->check(CLI::ExistingFile);
  auto* key_option =
      serve_cmd->add_option("--tls-key", tls_key, "the certificate's PEM private key")->check(CLI::ExistingFile);
  cert_option->needs(key_option);
  key_option->needs(cert_option);

  auto* check_cmd =
      app.add_subcommand("check-policy", "validate a policy file (and its memory table) and print a summary");
  std::string check_table;
  check_cmd->add_option("policy", policy_path, "policy YAML");
  check_cmd->add_option("--memory-table", check_table,
                        "validate a memory table on its own (the file `yolo8 profile` or `quotad memory-table` wrote)");

  std::string token_text;
  bool salted = false;
  auto* hash_cmd = app.add_subcommand("hash-token", "print the SHA-256 of a token for the policy's users");
  hash_cmd->add_option("token", token_text, "token")->required();
  hash_cmd->add_flag("--salt", salted, "draw a random salt and print {token_sha256, token_salt}");

  std::string backup_db = "quotad.db";
  int backup_keep_now = 24;
  auto* backup_cmd = app.add_subcommand(
      "backup", "an online backup of the database now (quotad may keep serving): <db>.backup-<UTC time>");
  backup_cmd->add_option("--db", backup_db, "quotad's SQLite database")->capture_default_str();
  backup_cmd->add_option("--keep", backup_keep_now, "backups kept (the newest)")
      ->check(CLI::Range(1, 10000))
      ->capture_default_str();

  std::string repair_db = "quotad.db";
  auto* repair_cmd = app.add_subcommand(
      "repair-db", "with quotad stopped: keep a copy, set unparseable rows aside, record audit gaps");
  repair_cmd->add_option("--db", repair_db, "quotad's SQLite database")->capture_default_str();

  AdminArgs admin;
  auto add_admin = [&](CLI::App* command) {
    command->add_option("--server", admin.server, "quotad URL")->capture_default_str();
    command->add_option("--token", admin.token, "bearer token (default: $QUOTAD_TOKEN)");
    command->add_flag("--json", admin.raw_json, "print the raw JSON");
  };
  auto* teams_cmd = app.add_subcommand("teams", "usage per team");
  add_admin(teams_cmd);
  std::string state_filter;
  auto* leases_cmd = app.add_subcommand("leases", "list leases");
  add_admin(leases_cmd);
  leases_cmd->add_option("--state", state_filter, "only this state (default: unfinished ones)");
  int64_t approval_id = 0;
  std::string note;
  auto* approve_cmd = app.add_subcommand("approve", "approve a request (team lead or admin)");
  add_admin(approve_cmd);
  approve_cmd->add_option("id", approval_id, "approval id")->required();
  approve_cmd->add_option("--note", note, "note for the audit log");
  auto* reject_cmd = app.add_subcommand("reject", "reject a request (team lead or admin)");
  add_admin(reject_cmd);
  reject_cmd->add_option("id", approval_id, "approval id")->required();
  reject_cmd->add_option("--note", note, "reason for the audit log");
  auto* approvals_cmd = app.add_subcommand("approvals", "list approval requests");
  add_admin(approvals_cmd);
  int64_t after = 0;
  int limit = 100;
  auto* audit_cmd = app.add_subcommand("audit", "print the audit log");
  add_admin(audit_cmd);
  audit_cmd->add_option("--after", after, "only entries after this sequence number");
  audit_cmd->add_option("--limit", limit, "at most this many entries")->check(CLI::Range(1, 1000));
  bool audit_verify = false;
  std::string audit_db = "quotad.db", audit_password_file;
  audit_cmd->add_flag("--verify", audit_verify,
                      "recompute the audit log's hash chain from the database (read-only) and name the first broken "
                      "entry; exit 1 when broken");
  audit_cmd->add_option("--db", audit_db, "with --verify: quotad's database (a SQLite file or a PostgreSQL URL)")
      ->capture_default_str();
  audit_cmd->add_option("--db-password-file", audit_password_file, "with --verify on PostgreSQL: the password's file");

  // the ledger (issue 19)
  std::string loan_state, ledger_text, ledger_user, ledger_month;
  double ledger_hours = 0;
  int64_t loan_id = 0;
  auto* loans_cmd = app.add_subcommand("loans", "list loan applications (own; leads: the team's; admins: all)");
  add_admin(loans_cmd);
  loans_cmd->add_option("--state", loan_state, "pending, approved, rejected, repaid or expired");
  auto* apply_cmd = app.add_subcommand("apply-loan", "apply for GPU-hours beyond this month's allowance");
  add_admin(apply_cmd);
  apply_cmd->add_option("hours", ledger_hours, "GPU-hours")->required();
  apply_cmd->add_option("--justification", ledger_text, "why (for the lead who decides)")->required();
  auto* approve_loan_cmd = app.add_subcommand("approve-loan", "approve a loan (a lead of the team or an admin)");
  add_admin(approve_loan_cmd);
  approve_loan_cmd->add_option("id", loan_id, "loan id")->required();
  approve_loan_cmd->add_option("--note", note, "note for the audit log");
  auto* reject_loan_cmd = app.add_subcommand("reject-loan", "reject a loan (a lead of the team or an admin)");
  add_admin(reject_loan_cmd);
  reject_loan_cmd->add_option("id", loan_id, "loan id")->required();
  reject_loan_cmd->add_option("--note", note, "reason for the audit log");
  auto* grant_cmd = app.add_subcommand("grant", "grant contribution credits to a member (a lead or an admin)");
  add_admin(grant_cmd);
  grant_cmd->add_option("user", ledger_user, "member")->required();
  grant_cmd->add_option("hours", ledger_hours, "GPU-hours")->required();
  grant_cmd->add_option("--reason", ledger_text, "the contribution: a shared tool, a dataset, ...")->required();
  auto* balance_cmd = app.add_subcommand("balance", "a member's allowance, use, loans and grants for a month");
  add_admin(balance_cmd);
  balance_cmd->add_option("--user", ledger_user, "member (default: the caller)");
  balance_cmd->add_option("--month", ledger_month, "YYYY-MM (default: this month)");

  std::string report_month, report_quarter, report_format = "md", report_db = "quotad.db", report_policy, report_out;
  int report_top = 10;
  auto* report_cmd = app.add_subcommand(
      "report", "monthly usage journal per team (--month), or the quarter-end statement per member (--quarter)");
  report_cmd->add_option("--month", report_month, "YYYY-MM (UTC)");
  report_cmd->add_option("--quarter", report_quarter,
                         "YYYY-Qn: balances, loans, grants and a ranking (needs --policy)");
  report_cmd->add_option("--format", report_format, "md, html or csv")
      ->check(CLI::IsMember({"md", "html", "csv"}))
      ->capture_default_str();
  report_cmd->add_option("--db", report_db, "quotad's database: a SQLite file or a PostgreSQL URL")
      ->capture_default_str();
  std::string report_password_file;
  report_cmd->add_option("--db-password-file", report_password_file, "PostgreSQL: the password's file");
  report_cmd->add_option("--policy", report_policy, "policy YAML: teams, credit allowances, waste thresholds");
  report_cmd->add_option("--out", report_out, "write to this file instead of stdout");
  report_cmd->add_option("--top", report_top, "top jobs listed")->check(CLI::Range(1, 1000))->capture_default_str();

  std::string table_db = "quotad.db", table_out, table_device, table_libtorch;
  bool table_observed = false;
  auto* table_cmd = app.add_subcommand(
      "memory-table", "write a memory table (the policy's schema) learned from the peaks real runs reported");
  table_cmd->add_flag("--observed", table_observed, "from the heartbeats' memory observations (required)")->required();
  table_cmd->add_option("--db", table_db, "quotad's SQLite database")->capture_default_str();
  table_cmd->add_option("--device", table_device, "the device whose table to write (when several reported)");
  table_cmd->add_option("--libtorch", table_libtorch,
                        "the LibTorch version whose table to write (when runs reported several; "
                        "'unknown': the runs that did not say)");
  table_cmd->add_option("--out", table_out, "write to this file instead of stdout");

  int recommend_months = 3;
  std::string recommend_db = "quotad.db", recommend_policy, recommend_diff;
  auto* recommend_cmd = app.add_subcommand(
      "recommend", "propose base and burst per team from the recorded history, with the figures and a policy diff");
  recommend_cmd->add_option("--months", recommend_months, "history to read: the last N x 30 days")
      ->check(CLI::Range(1, 36))
      ->capture_default_str();
  recommend_cmd->add_option("--db", recommend_db, "quotad's database: a SQLite file or a PostgreSQL URL")
      ->capture_default_str();
  std::string recommend_password_file;
  recommend_cmd->add_option("--db-password-file", recommend_password_file, "PostgreSQL: the password's file");
  recommend_cmd->add_option("--policy", recommend_policy, "the policy file the diff applies to")->required();
  std::string recommend_until;
  recommend_cmd->add_option("--until", recommend_until,
                            "YYYY-MM-DD (UTC): the window ends at that midnight (default: now)");
  recommend_cmd->add_option("--diff", recommend_diff, "also write the diff alone to this file (patch -p0 < FILE)");

  std::string render_out;
  double render_memory_per_gpu = 32;
  auto* render_cmd =
      app.add_subcommand("render-k8s", "write Namespaces, ResourceQuotas and LimitRanges from the policy");
  render_cmd->add_option("--policy", policy_path, "policy YAML")->required();
  render_cmd->add_option("--out", render_out, "write to this file instead of stdout");
  render_cmd->add_option("--memory-per-gpu", render_memory_per_gpu, "host memory (GiB) a GPU comes with")
      ->capture_default_str();

  CLI11_PARSE(app, argc, argv);
  try {
    if (*serve_cmd) {
      return serve(policy_path, db, db_password_file, listen, full_sync, threads, tls_cert, tls_key, backup_every_min,
                   backup_keep, max_connections_per_address, max_connections, watch_every_s, init_db, advertise,
                   heartbeat_retention_days);
    }
    if (*check_cmd) {
      const auto describe = [](const MemoryTable& table) {
        std::string models;
        for (const auto& [model, estimate] : table.models) models += (models.empty() ? "" : ", ") + model;
        std::printf("memory table %s: ok: %zu models (%s); source %s%s%s\n", table.file.c_str(), table.models.size(),
                    models.c_str(), table.source.empty() ? "unknown" : table.source.c_str(),
                    table.provenance.device.empty() ? "" : ", measured on ",
                    table.provenance.device.empty()
                        ? ""
                        : (table.provenance.device + ", " + table.provenance.precision + ", LibTorch " +
                           (table.provenance.libtorch.empty() ? "unknown" : table.provenance.libtorch) + ", " +
                           table.provenance.date)
                              .c_str());
        if (table.process_overhead_gib >= 0) {
          std::printf("  process_overhead_gib %.2f: the measured per-process GPU memory beyond the allocator's cap\n",
                      table.process_overhead_gib);
        }
      };
      if (policy_path.empty() && check_table.empty()) {
        std::fprintf(stderr, "quotad check-policy: give a policy file or --memory-table FILE\n");
        return 2;
      }
      if (!check_table.empty()) describe(load_memory_table(check_table));
      if (policy_path.empty()) return 0;
      const Policy policy = load_policy_with_tokens(policy_path);
      std::printf("%s: ok: %d GPUs (%d reserved for critical leases), %zu teams, %zu users\n", policy_path.c_str(),
                  policy.total_gpus(), policy.emergency_pool_gpus(), policy.teams.size(), policy.users.size());
      // what a trainer's $NODE_NAME and visible GPU UUIDs are matched against
      for (const auto& node : policy.nodes) {
        std::string uuids;
        for (const auto& uuid : node.uuids) uuids += (uuids.empty() ? "" : ", ") + uuid;
        std::printf("  node %s: %d GPUs of %g GiB; %s\n", node.name.c_str(), node.gpus, node.memory_gib,
                    uuids.empty() ? "no GPU UUIDs (a trainer's visible GPUs are recorded, not matched)"
                                  : ("UUIDs " + uuids).c_str());
      }
      if (!policy.memory_table.models.empty()) describe(policy.memory_table);
      // which overhead shared placement counts: the memory table's measured figure or the policy's default
      if (policy.sharing_enabled) {
        std::printf("  shared GPUs: each lease takes its share plus %s\n", policy.describe_shared_overhead().c_str());
      }
      return 0;
    }
    if (*table_cmd) {
      const DbTarget table_target = parse_db_target(table_db);
      if (table_target.kind == DbTarget::Kind::kSqlite && !std::filesystem::exists(table_target.location)) {
        throw std::runtime_error(table_db + ": no such database");
      }
      const std::vector<ObservedRow> all = fit_observed(open_store(table_target)->memory_observations());
      // one table per device, precision and LibTorch version (an upgrade can change what a batch needs)
      std::map<std::string, std::vector<ObservedRow>> by_table;
      for (const auto& row : all) {
        if ((table_device.empty() || row.device == table_device) &&
            (table_libtorch.empty() || row.libtorch == table_libtorch ||
             (table_libtorch == "unknown" && row.libtorch.empty()))) {
          by_table[row.device + (row.amp ? ", amp" : ", float32") + ", LibTorch " +
                   (row.libtorch.empty() ? "unknown" : row.libtorch)]
              .push_back(row);
        }
      }
      if (by_table.size() != 1) {
        std::string found;
        for (const auto& [name, rows] : by_table) found += "\n  " + name;
        std::fprintf(stderr, "quotad memory-table: %s%s\n",
                     by_table.empty() ? "no memory observations"
                                      : "observations from several devices, precisions or LibTorch versions; "
                                        "choose one with --device and --libtorch:",
                     found.c_str());
        return 2;
      }
      const int64_t now = system_now_ms();
      const std::time_t seconds = static_cast<std::time_t>(now / 1000);
      char day[16];
      std::strftime(day, sizeof(day), "%Y-%m-%d", std::gmtime(&seconds));
      // heartbeats' peaks say nothing of the per-process overhead (`yolo8 profile` measures it): a table being
      // replaced keeps its figure when it was measured on the same device
      double overhead = -1;
      const std::string& device = by_table.begin()->second.front().device;
      if (!table_out.empty() && std::filesystem::exists(table_out)) {
        try {
          const MemoryTable previous = load_memory_table(table_out);
          if (previous.process_overhead_gib >= 0 &&
              (previous.provenance.device.empty() || previous.provenance.device == device)) {
            overhead = previous.process_overhead_gib;
            std::fprintf(stderr, "quotad memory-table: kept process_overhead_gib %.2f from %s\n", overhead,
                         table_out.c_str());
          } else if (previous.process_overhead_gib >= 0) {
            std::fprintf(
                stderr, "quotad memory-table: dropped process_overhead_gib %.2f of %s: measured on %s, not %s\n",
                previous.process_overhead_gib, table_out.c_str(), previous.provenance.device.c_str(), device.c_str());
          }
        } catch (const PolicyError&) {
          // not a memory table: replaced as before
        }
      }
      const std::string text = observed_table_yaml(by_table.begin()->second, day, overhead);
      if (by_table.begin()->second.front().libtorch.empty()) {
        std::fprintf(stderr,
                     "quotad memory-table: these runs did not report their LibTorch version (trainers before it "
                     "was sent); the table's provenance leaves it out\n");
      }
      for (const auto& row : by_table.begin()->second) {
        std::fprintf(stderr, "%s on %s: %.3f GiB + %.4f GiB per image at 640 from %d runs\n", row.model.c_str(),
                     row.device.c_str(), row.fixed_gib, row.per_image_gib, row.samples);
      }
      write_output(table_out, text);
      return 0;
    }
    if (*render_cmd) {
      K8sRenderOptions options;
      options.host_memory_gib_per_gpu = render_memory_per_gpu;
      const std::string text = render_k8s(load_policy(policy_path), options);
      write_output(render_out, text);
      if (!render_out.empty()) std::fprintf(stderr, "wrote %s\n", render_out.c_str());
      return 0;
    }
    if (*recommend_cmd) {
      const Policy policy = load_policy(recommend_policy);
      std::ifstream policy_in(recommend_policy, std::ios::binary);
      const std::string policy_text((std::istreambuf_iterator<char>(policy_in)), std::istreambuf_iterator<char>());
      int64_t now = system_now_ms();
      if (!recommend_until.empty()) {
        int64_t month_start = 0, month_end = 0;
        const bool shape = recommend_until.size() == 10 && recommend_until[7] == '-' &&
                           std::isdigit(static_cast<unsigned char>(recommend_until[8])) &&
                           std::isdigit(static_cast<unsigned char>(recommend_until[9]));
        try {
          if (!shape) throw std::invalid_argument("shape");
          month_range_ms(recommend_until.substr(0, 7), month_start, month_end);
        } catch (const std::invalid_argument&) {
          throw std::runtime_error("--until: expected YYYY-MM-DD, got '" + recommend_until + "'");
        }
        now = month_start + (std::stoll(recommend_until.substr(8, 2)) - 1) * 86400000LL;
        if (recommend_until.substr(8, 2) == "00" || now >= month_end) {
          throw std::runtime_error("--until: no such day '" + recommend_until + "'");
        }
      }
      StoreOptions read_options;
      read_options.password_file = recommend_password_file;
      const UsageHistory history =
          load_history(*open_report_reader(parse_db_target(recommend_db), read_options), policy,
                       now - static_cast<int64_t>(recommend_months) * 30 * 86400000LL, now);
      const Recommendation recommendation = recommend(policy, history);
      const std::string diff = policy_diff(policy_text, recommend_policy, policy, recommendation);
      std::printf("%s\n", recommendation_text(recommendation).c_str());
      std::printf("%s", diff.empty() ? "The policy already matches: no change proposed.\n"
                                     : ("Policy diff (apply with: patch -p0 < FILE):\n\n" + diff).c_str());
      if (!recommend_diff.empty()) write_output(recommend_diff, diff);
      return 0;
    }
    if (*report_cmd && !report_quarter.empty()) {
      if (!report_month.empty()) throw std::runtime_error("--quarter: give either --month or --quarter, not both");
      quarter_months(report_quarter);  // names --quarter before anything else is read
      if (report_policy.empty()) throw std::runtime_error("--policy: required with --quarter (the credit rules)");
      StoreOptions read_options;
      read_options.password_file = report_password_file;
      const QuarterStatement statement = build_statement(*open_report_reader(parse_db_target(report_db), read_options),
                                                         report_quarter, load_policy(report_policy));
      const std::string text = report_format == "html"  ? statement_html(statement)
                               : report_format == "csv" ? statement_csv(statement)
                                                        : statement_markdown(statement);
      write_output(report_out, text);
      return 0;
    }
    if (*report_cmd) {
      if (report_month.empty()) throw std::runtime_error("--month: required (or --quarter)");
      std::unique_ptr<Policy> policy;
      if (!report_policy.empty()) policy = std::make_unique<Policy>(load_policy(report_policy));
      int64_t month_start = 0, month_end = 0;
      month_range_ms(report_month, month_start, month_end);  // names --month before the database is opened
      StoreOptions read_options;
      read_options.password_file = report_password_file;
      const MonthlyReport report = build_report(*open_report_reader(parse_db_target(report_db), read_options),
                                                report_month, policy.get(), report_top);
      const std::string text = report_format == "html"  ? report_html(report)
                               : report_format == "csv" ? report_csv(report)
                                                        : report_markdown(report);
      write_output(report_out, text);
      return 0;
    }
    if (*hash_cmd) {
      if (!salted) {
        std::printf("%s\n", sha256_hex(token_text).c_str());
        return 0;
      }
      std::random_device random;  // the kernel's entropy
      std::string salt;
      char hex[3];
      for (int i = 0; i < 16; ++i) {
        std::snprintf(hex, sizeof(hex), "%02x", static_cast<unsigned>(random() & 0xff));
        salt += hex;
      }
      std::printf("{token_sha256: %s, token_salt: %s}\n", sha256_hex(salt + token_text).c_str(), salt.c_str());
      return 0;
    }
    if (*backup_cmd) {
      const std::string file =
          sqlite_only(backup_db, "backup",
                      "back it up with pg_dump, or continuous WAL archiving for point-in-time recovery (PITR)");
      std::printf("quotad backup: %s\n", backup_database(file, system_now_ms(), backup_keep_now).c_str());
      return 0;
    }
    if (*repair_cmd) {
      const std::string file = sqlite_only(repair_db, "repair-db",
                                           "PostgreSQL keeps its pages whole itself; restore a pg_dump or a point in "
                                           "time (PITR), and move a row that does not parse to the table quarantine "
                                           "by hand");
      const RepairReport report = repair_database(file, system_now_ms());
      if (report.backup.empty()) {
        std::printf("quotad repair-db: %s was missing\n", file.c_str());
      } else {
        std::printf("quotad repair-db: copy kept as %s\n", report.backup.c_str());
      }
      if (!report.restored_from.empty()) std::printf("  restored from the backup %s\n", report.restored_from.c_str());
      for (const auto& line : report.salvaged) std::printf("  read from the damaged file: %s\n", line.c_str());
      for (const auto& row : report.quarantined) std::printf("  set aside in table quarantine: %s\n", row.c_str());
      for (int64_t seq : report.audit_gaps) {
        std::printf("  audit entry %lld was missing: recorded as audit.gap\n", static_cast<long long>(seq));
      }
      if (report.id_epoch > 0) {
        std::printf(
            "  ids continue at %lld (a new epoch: none handed out before the restore is reused); %s "
            "recorded as lost in one audit.gap entry\n",
            static_cast<long long>(report.id_epoch), report.lost_entries.c_str());
      }
      for (const auto& line : report.unrecorded) std::printf("  lost: %s\n", line.c_str());
      if (report.quarantined.empty() && report.audit_gaps.empty() && report.restored_from.empty() &&
          report.salvaged.empty() && report.unrecorded.empty()) {
        std::printf("  nothing to repair\n");
      }
      return 0;
    }
    if (*audit_cmd && audit_verify) {
      StoreOptions audit_options;
      audit_options.password_file = audit_password_file;
      const AuditChainCheck check = verify_audit_chain(parse_db_target(audit_db), audit_options);
      if (!check.intact) {
        std::printf("quotad audit --verify: %s: the chain is broken at %s\n", audit_db.c_str(), check.problem.c_str());
        return 1;
      }
      std::printf("quotad audit --verify: %s: %lld entries, chain intact", audit_db.c_str(),
                  static_cast<long long>(check.entries));
      if (check.unchained > 0) {
        std::printf(" (the first %lld written before the chain existed)", static_cast<long long>(check.unchained));
      }
      if (check.head_seq > 0) {
        std::printf("; head: entry %lld sha256 %s", static_cast<long long>(check.head_seq), check.head.c_str());
      }
      std::printf("\n");
      for (const std::string& gap : check.recorded_gaps) std::printf("  recorded gap: %s\n", gap.c_str());
      return 0;
    }
    json reply;
    if (*teams_cmd) {
      reply = admin_call(admin, "GET", "/v1/teams");
      if (!admin.raw_json) {
        std::printf("%-16s %6s %6s %6s %7s %6s %7s %8s\n", "team", "base", "burst", "limit", "in_use", "active",
                    "queued", "approval");
        for (const auto& team : reply["teams"]) {
          std::printf("%-16s %6.1f %6.1f %6.1f %7.2f %6d %7d %8d\n", team["name"].get<std::string>().c_str(),
                      team["base"].get<double>(), team["burst"].get<double>(), team["limit_now"].get<double>(),
                      team["gpus_in_use"].get<double>(), team["leases_active"].get<int>(), team["queued"].get<int>(),
                      team["pending_approval"].get<int>());
        }
        std::printf("total GPUs %d, emergency pool %d\n", reply["total_gpus"].get<int>(),
                    reply["emergency_pool_gpus"].get<int>());
        return 0;
      }
    } else if (*leases_cmd) {
      reply = admin_call(admin, "GET", "/v1/leases" + (state_filter.empty() ? "" : "?state=" + state_filter));
      if (!admin.raw_json) {
        std::printf("%-6s %-16s %-8s %-14s %-9s %-8s %4s %-20s %s\n", "id", "state", "user", "team", "model",
                    "priority", "gpus", "devices", "reason");
        for (const auto& lease : reply["leases"]) {
          std::string devices;
          for (const auto& device : lease["devices"]) {
            devices += (devices.empty() ? "" : ",") + device.get<std::string>();
          }
          const auto& report = lease["request"];
          std::printf("%-6lld %-16s %-8s %-14s %-9s %-8s %4d %-20s %s\n",
                      static_cast<long long>(lease["id"].get<int64_t>()), lease["state"].get<std::string>().c_str(),
                      report["user"].get<std::string>().c_str(), report["team"].get<std::string>().c_str(),
                      report["model"].get<std::string>().c_str(), report["priority"].get<std::string>().c_str(),
                      lease["gpus"].get<int>(), devices.c_str(), lease.value("reason", "").c_str());
        }
        return 0;
      }
    } else if (*approve_cmd || *reject_cmd) {
      const std::string verb = *approve_cmd ? "approve" : "reject";
      reply = admin_call(admin, "POST", "/v1/approvals/" + std::to_string(approval_id) + "/" + verb,
                         json{{"note", note}}.dump());
      if (!admin.raw_json) {
        std::printf("approval %lld: %s by %s; lease %lld is %s\n", static_cast<long long>(approval_id),
                    reply["state"].get<std::string>().c_str(), reply["decided_by"].get<std::string>().c_str(),
                    static_cast<long long>(reply["lease_id"].get<int64_t>()),
                    reply["lease"]["state"].get<std::string>().c_str());
        return 0;
      }
    } else if (*loans_cmd) {
      reply = admin_call(admin, "GET", "/v1/loans" + (loan_state.empty() ? "" : "?state=" + loan_state));
      if (!admin.raw_json) {
        std::printf("%-5s %-10s %-14s %-8s %8s %-9s %-10s %8s %s\n", "id", "user", "team", "month", "hours", "state",
                    "decided_by", "repaid", "justification");
        for (const auto& loan : reply["loans"]) {
          std::printf("%-5lld %-10s %-14s %-8s %8.1f %-9s %-10s %8.1f %s\n",
                      static_cast<long long>(loan["id"].get<int64_t>()), loan["user"].get<std::string>().c_str(),
                      loan["team"].get<std::string>().c_str(), loan["month"].get<std::string>().c_str(),
                      loan["amount_gpu_hours"].get<double>(), loan["state"].get<std::string>().c_str(),
                      loan["decided_by"].get<std::string>().c_str(), loan["repaid_gpu_hours"].get<double>(),
                      loan["justification"].get<std::string>().c_str());
        }
        return 0;
      }
    } else if (*apply_cmd) {
      reply = admin_call(admin, "POST", "/v1/loans",
                         json{{"amount_gpu_hours", ledger_hours}, {"justification", ledger_text}}.dump());
    } else if (*approve_loan_cmd || *reject_loan_cmd) {
      reply = admin_call(admin, "POST",
                         "/v1/loans/" + std::to_string(loan_id) + (*approve_loan_cmd ? "/approve" : "/reject"),
                         json{{"note", note}}.dump());
    } else if (*grant_cmd) {
      reply =
          admin_call(admin, "POST", "/v1/credits",
                     json{{"user", ledger_user}, {"amount_gpu_hours", ledger_hours}, {"reason", ledger_text}}.dump());
    } else if (*balance_cmd) {
      std::string query;
      if (!ledger_user.empty()) query += "user=" + ledger_user;
      if (!ledger_month.empty()) query += (query.empty() ? "" : "&") + std::string("month=") + ledger_month;
      reply = admin_call(admin, "GET", "/v1/balance" + (query.empty() ? "" : "?" + query));
      if (!admin.raw_json) {
        std::printf(
            "%s (%s), %s: allowance %.1f GPU-hours = monthly %.1f + automatic loan %.1f + loans %.1f + "
            "grants %.1f - repaying %.1f; used %.1f; balance %.1f\n",
            reply["user"].get<std::string>().c_str(), reply["team"].get<std::string>().c_str(),
            reply["month"].get<std::string>().c_str(), reply["allowance_gpu_hours"].get<double>(),
            reply["monthly_gpu_hours"].get<double>(), reply["automatic_loan_gpu_hours"].get<double>(),
            reply["loans_gpu_hours"].get<double>(), reply["grants_gpu_hours"].get<double>(),
            reply["repaying_gpu_hours"].get<double>(), reply["used_gpu_hours"].get<double>(),
            reply["balance_gpu_hours"].get<double>());
        return 0;
      }
    } else if (*approvals_cmd) {
      reply = admin_call(admin, "GET", "/v1/approvals");
    } else if (*audit_cmd) {
      reply = admin_call(admin, "GET", "/v1/audit?after=" + std::to_string(after) + "&limit=" + std::to_string(limit));
      if (!admin.raw_json) {
        for (const auto& entry : reply["audit"]) {
          std::printf(
              "%6lld %s %-10s %-18s lease=%-5lld %-14s %s\n", static_cast<long long>(entry["seq"].get<int64_t>()),
              fmt_ms(entry["ts_ms"].get<int64_t>()).c_str(), entry["actor"].get<std::string>().c_str(),
              entry["action"].get<std::string>().c_str(), static_cast<long long>(entry["lease_id"].get<int64_t>()),
              entry["team"].get<std::string>().c_str(), entry["detail"].get<std::string>().c_str());
        }
        return 0;
      }
    }
    std::cout << reply.dump(2) << "\n";
  } catch (const std::exception& entry) {
    std::cerr << "quotad: " << entry.what() << "\n";
    return 1;
  }
  return 0;
}
