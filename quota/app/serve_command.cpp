// quotad serve: the service, its online backups and the reload of its policy, tokens and TLS files.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "common/exit_codes.h"
#include "quota/app/command_table.h"
#include "quota/core/calendar.h"
#include "quota/core/sha256.h"
#include "quota/server/http_server.h"
#include "quota/server/tls_credentials.h"
#include "quota/service/service.h"
#include "quota/store/store.h"
#include "quota/store/writer_lock.h"

namespace yolo8::quota {
namespace {

constexpr const char* kIsoUtc = "%Y-%m-%dT%H:%M:%SZ";  // a certificate's notAfter, as openssl prints it

struct ServeArgs {
  std::string policy_path = "configs/quota-policy.yaml";
  std::string db = "quotad.db";
  std::string db_password_file;
  std::string advertise;
  bool init = false;
  std::string listen = "127.0.0.1:8470";
  bool full_sync = false;
  int threads = 64;
  int backup_every_min = 60;
  int backup_keep = 24;
  // connections that have not yet presented a valid token, per peer address; behind a TLS proxy or a NAT
  // every trainer shares one address (docs/quotad-security.md)
  int max_connections_per_address = ServerOptions{}.max_connections_per_client;
  int max_connections = ServerOptions{}.max_connections;
  int watch_every_s = 5;
  int heartbeat_retention_days = 14;
  std::string tls_cert, tls_key;
};

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

int serve(const ServeArgs& args) {
  const DbTarget target = parse_db_target(args.db);  // before anything starts: a URL with a password is refused
  const bool sqlite = target.kind == DbTarget::Kind::kSqlite;
  int backup_every_min = args.backup_every_min;
  if (!sqlite && backup_every_min > 0) {
    std::printf(
        "quotad: %s is backed up by PostgreSQL's own means (pg_dump, continuous archiving): --backup-every "
        "does not apply\n",
        args.db.c_str());
    backup_every_min = 0;
  }
  const char* tokens_env = std::getenv("QUOTAD_TOKENS_FILE");
  const std::string tokens_path = tokens_env != nullptr ? tokens_env : "";
  Policy policy = load_policy(args.policy_path, tokens_path);
  auto upkeep = std::make_shared<Upkeep>();
  upkeep->watch("policy");
  if (!tokens_path.empty()) upkeep->watch("tokens");
  if (!args.tls_cert.empty()) {
    // before anything is opened: an expired certificate would only fail every trainer's handshake
    check_certificate(TlsCredentials::load(args.tls_cert, args.tls_key)->facts(), args.tls_cert, "at start");
    upkeep->watch("tls");
  }
  // Before the database is opened: a second quotad on it would expire the first one's leases under it.
  std::optional<WriterLock> writer;
  if (sqlite) writer.emplace(target.location);
  // never an empty database in place of one whose backups lie beside it, unless asked for
  if (sqlite) prepare_database(target.location, args.init, system_now_ms());
  ServerOptions so;
  parse_listen(args.listen, so.host, so.port);
  so.threads = args.threads;
  so.max_connections_per_client = args.max_connections_per_address;
  so.max_connections = args.max_connections;
  so.tls_cert_file = args.tls_cert;
  so.tls_key_file = args.tls_key;
  so.operations = [file = target.location, backup_every_min, upkeep] {
    OperationsFigures ops = upkeep->figures();
    ops.backup_interval_ms = int64_t{backup_every_min} * 60000;
    if (ops.backup_interval_ms > 0) ops.newest_backup_ms = newest_backup_ms(file);  // a directory listing per scrape
    return ops;
  };
  ServiceOptions opts;
  opts.db_path = args.db;
  opts.db_password_file = args.db_password_file;
  if (!sqlite) {
    // what a follower's 503 names: the URL trainers reach this replica at
    char host[256] = {};
    gethostname(host, sizeof host - 1);
    // with port 0 the port is known only once serving: nothing to name then without --advertise
    opts.replica_address = !args.advertise.empty() ? args.advertise
                           : so.port == 0          ? std::string()
                                          : std::string(args.tls_cert.empty() ? "http" : "https") + "://" + host + ":" +
                                                std::to_string(so.port);
  }
  opts.full_sync = args.full_sync;
  // a state change waits at most 2 s for SQLite (another process holding the lock, a slow disk), then 503;
  // for a second after that, changes get 503 at once
  opts.store_busy_timeout_ms = 2000;
  opts.outage_after_ms = 3000;  // the maintenance thread ticks every second
  opts.heartbeat_retention_ms = int64_t{args.heartbeat_retention_days} * 86400000;
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
  std::printf("quotad: serving %s (%d GPUs, %zu teams) on %s://%s:%d, db %s\n", args.policy_path.c_str(),
              service.policy().total_gpus(), service.policy().teams.size(), args.tls_cert.empty() ? "http" : "https",
              so.host.c_str(), port, args.db.c_str());
  std::fflush(stdout);
  const PeriodicBackup backups(target.location, backup_every_min,
                               args.backup_keep);  // online copies beside a SQLite file

  // SIGHUP reloads every watched file; without it, a file whose content changed (checked every --watch-every seconds)
  // is reloaded. A file is tried once per content: a broken one is not retried until it changes or SIGHUP.
  std::vector<std::string> watched = {args.policy_path};
  if (!tokens_path.empty()) watched.push_back(tokens_path);
  if (!args.tls_cert.empty()) watched.insert(watched.end(), {args.tls_cert, args.tls_key});
  std::map<std::string, std::string> seen;
  for (const auto& path : watched) seen[path] = fingerprint(path);
  auto changed = [&](const std::string& path) {
    if (path.empty()) return false;
    const std::string now = fingerprint(path);
    return now != std::exchange(seen[path], now);
  };
  auto reload_policy = [&](const std::string& kind) {
    try {
      const std::string summary = service.reload_policy(load_policy(args.policy_path, tokens_path));
      upkeep->applied(kind);
      std::fprintf(stderr, "quotad: reloaded %s%s: %s\n", args.policy_path.c_str(),
                   tokens_path.empty() ? "" : (" and " + tokens_path).c_str(),
                   summary.empty() ? "no change to teams, users or limits" : summary.c_str());
    } catch (const std::exception& error) {
      std::string message = error.what();
      const bool names_tokens = !tokens_path.empty() && message.rfind(tokens_path, 0) == 0;
      if (!names_tokens && message.rfind(args.policy_path, 0) != 0) message = args.policy_path + ": " + message;
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
        check_certificate(TlsCredentials::load(args.tls_cert, args.tls_key)->facts(), args.tls_cert, "on reload");
        return server.reload_tls();
      }();
      upkeep->applied("tls");
      upkeep->certificate(facts.not_after_ms);
      const std::string detail = args.tls_cert + ": serial " + facts.serial + ", subject " + facts.subject +
                                 ", notAfter " + utc_text(facts.not_after_ms, kIsoUtc);
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
    if (args.watch_every_s > 0) {
      const timespec timeout{args.watch_every_s, 0};
      sig = sigtimedwait(&set, nullptr, &timeout);
    } else {
      sigwait(&set, &sig);
    }
    if (sig == SIGINT || sig == SIGTERM) break;
    const bool forced = sig == SIGHUP;
    if (forced)
      std::fprintf(stderr, "quotad: SIGHUP: reloading the policy%s\n", args.tls_cert.empty() ? "" : " and TLS");
    const bool policy_changed = changed(args.policy_path);
    const bool tokens_changed = changed(tokens_path);
    if (forced || policy_changed || tokens_changed) reload_policy(policy_changed || forced ? "policy" : "tokens");
    const bool cert_changed = changed(args.tls_cert);
    const bool key_changed = changed(args.tls_key);
    if (!args.tls_cert.empty() && (forced || cert_changed || key_changed)) reload_tls();
  }
  std::printf("quotad: signal %d, stopping\n", sig);
  server.stop();
  return kExitCompleted;
}

}  // namespace

void add_serve_command(CLI::App& app, CommandTable& table) {
  auto args = std::make_shared<ServeArgs>();
  auto* serve_cmd = app.add_subcommand("serve", "run the service");
  serve_cmd->add_option("--policy", args->policy_path, "policy YAML")->capture_default_str();
  serve_cmd
      ->add_option("--db", args->db,
                   "the database: a SQLite file (PATH or sqlite:PATH, created if missing, unless backups of one lie "
                   "beside it) or a PostgreSQL URL "
                   "(postgresql://USER@HOST/DB, no password in it)")
      ->capture_default_str();
  serve_cmd->add_option("--db-password-file", args->db_password_file,
                        "PostgreSQL: a file whose first line is the password (else libpq's PGPASSWORD / PGPASSFILE)");
  serve_cmd->add_option("--advertise", args->advertise,
                        "PostgreSQL replicas: the URL trainers reach this replica at, which the others name while it "
                        "leads (default: http(s)://HOSTNAME:PORT)");
  serve_cmd->add_flag("--init", args->init,
                      "SQLite: create a missing --db even where backups of one lie beside it (its ids start above "
                      "theirs)");
  serve_cmd->add_option("--listen", args->listen, "HOST:PORT (port 0 picks a free one)")->capture_default_str();
  serve_cmd->add_flag("--sync-full", args->full_sync, "fsync every commit (survives power loss; slower)");
  serve_cmd->add_option("--threads", args->threads, "HTTP worker threads")->check(CLI::Range(2, 1024));
  serve_cmd->add_option("--backup-every", args->backup_every_min, "minutes between online backups of --db (0: none)")
      ->check(CLI::Range(0, 10080))
      ->capture_default_str();
  serve_cmd->add_option("--backup-keep", args->backup_keep, "online backups kept (the newest)")
      ->check(CLI::Range(1, 10000))
      ->capture_default_str();
  serve_cmd
      ->add_option("--heartbeat-retention-days", args->heartbeat_retention_days,
                   "days raw heartbeats are kept (each hour is summed up per lease once over; the reports and a "
                   "restart read the sums)")
      ->check(CLI::Range(1, 36500))
      ->capture_default_str();
  serve_cmd
      ->add_option("--max-connections-per-address", args->max_connections_per_address,
                   "unauthenticated connections per peer address (the oldest idle one is closed, 429)")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  serve_cmd->add_option("--max-connections", args->max_connections, "open connections in all (more get 503)")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  serve_cmd
      ->add_option("--watch-every", args->watch_every_s,
                   "seconds between checks of the policy, $QUOTAD_TOKENS_FILE and the TLS files for a changed content, "
                   "reloaded as on SIGHUP (0: on SIGHUP only)")
      ->check(CLI::Range(0, 3600))
      ->capture_default_str();
  auto* cert_option =
      serve_cmd->add_option("--tls-cert", args->tls_cert, "serve HTTPS with this PEM certificate (chain)")
          ->check(CLI::ExistingFile);
  auto* key_option =
      serve_cmd->add_option("--tls-key", args->tls_key, "the certificate's PEM private key")->check(CLI::ExistingFile);
  cert_option->needs(key_option);
  key_option->needs(cert_option);
  table.add(serve_cmd, [args] { return serve(*args); });
}

}  // namespace yolo8::quota
