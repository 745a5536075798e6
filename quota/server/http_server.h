#pragma once
// quotad's HTTP front, forwarding to QuotaService, plus the maintenance thread (ticks every second, flushes
// heartbeat batches). libmicrohttpd (one epoll thread, TLS through GnuTLS) reads requests and writes answers;
// every complete request is suspended there and run by our own workers, one pool per lane of the route
// table, so heartbeats and /healthz never wait behind slow calls, and no worker ever waits on a slow client.
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "quota/server/metrics.h"
#include "quota/server/tls_credentials.h"
#include "quota/service/service.h"

struct MHD_Daemon;
struct MHD_Connection;

namespace yolo8::quota {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;                       // 0: an ephemeral port
  size_t max_body_bytes = 64 * 1024;  // larger bodies get 413
  int threads = 64;                   // workers for the API and the pages
  int fast_threads = 4;               // workers for the fast lane (heartbeats, /healthz)
  int tick_ms = 1000;
  int flush_ms = 200;
  // A request (head and body) must arrive whole within request_timeout_ms of the accept (a later request on a
  // kept-alive connection: of the previous answer plus keep_alive_idle_ms), else 408 and the connection
  // closes; a connection idle (neither reading nor writing) for keep_alive_idle_ms is closed, which bounds
  // writes to clients that stop reading too; heads over max_header_bytes or max_headers get 431.
  int request_timeout_ms = 5000;
  int keep_alive_idle_ms = 5000;
  int max_requests_per_connection = 1000;
  size_t max_header_bytes = 16 * 1024;
  int max_headers = 64;
  // Per peer address, connections that have not yet presented a valid token; over the cap, the address's
  // oldest such connection waiting for a request gets 429 and closes (the newcomer is served). A connection
  // whose request carried a valid token no longer counts: trainers behind one TLS proxy or NAT are never
  // refused for the address they share with a flood.
  int max_connections_per_client = 32;
  int max_connections = 4096;          // more get 503 and are closed
  size_t max_queued_requests = 10000;  // per lane; more get 503
  // HTTPS when both are set: PEM files of the certificate (chain) and its private key.
  std::string tls_cert_file;
  std::string tls_key_file;
  // /metrics' figures of quotad's upkeep (backups, reloads, the certificate), read at each scrape; empty: none.
  std::function<OperationsFigures()> operations;
};

// "HOST:PORT" -> host, port; throws std::invalid_argument naming the value.
void parse_listen(const std::string& listen, std::string& host, int& port);

class QuotaServer {
 public:
  QuotaServer(QuotaService& service, ServerOptions options);
  ~QuotaServer();
  // Binds and serves in the background; returns the bound port. Throws if the address cannot be bound or the
  // certificate or key cannot be read (naming the file).
  int start();
  void stop();
  // Blocks until stop() (or a signal handler calling stop()).
  void wait();
  int port() const { return port_; }
  // Reads the TLS certificate and key files again and serves them to new connections (open ones keep theirs);
  // throws naming the file, the running certificate kept, when they cannot be read or do not belong together.
  // Returns what the new certificate says.
  CertificateFacts reload_tls();
  // The certificate served now; null over plain HTTP.
  std::shared_ptr<const TlsCredentials> tls_credentials() const;

  struct Exchange;  // one request in flight (http_server.cpp)
  struct Peer;      // what the server knows about one connection

 private:
  struct Lane {
    std::mutex mutex;
    std::condition_variable cv;
    std::deque<Exchange*> jobs;
    std::vector<std::thread> workers;
  };
  struct Callbacks;  // libmicrohttpd's C callbacks (http_server.cpp)
  friend struct Callbacks;
  int request(MHD_Connection* connection, const char* url, const char* method, const char* version, const char* upload,
              size_t* upload_size, void** context);
  void connection_started(MHD_Connection* connection, void** socket_context);
  void connection_closed(void** socket_context);
  // Writes a plain error answer on a connection MHD has not answered (plain HTTP only), then half-closes it;
  // the watchdog closes it for good after a short drain. Called with peers_mutex_ held.
  void refuse_locked(Peer& peer, int status, const char* phrase, const std::string& reason);
  std::string over_cap_reason(const std::string& address) const;
  void work(Lane& lane);
  void watch();
  int queue_answer(MHD_Connection* connection, Exchange& exchange);
  Peer* live_locked(Peer* peer);

  QuotaService& service_;
  ServerOptions options_;
  MetricsExporter metrics_;
  bool tls_ = false;
  mutable std::mutex tls_mutex_;
  std::shared_ptr<const TlsCredentials> credentials_;  // with tls_mutex_
  // Replaced ones, kept while the server lives: a handshake that began before a reload may still use them (a
  // few kilobytes per reload).
  std::vector<std::shared_ptr<const TlsCredentials>> retired_credentials_;
  MHD_Daemon* daemon_ = nullptr;
  Lane api_, fast_;
  // The peer no longer counts against its address's cap (authenticated or refused). With peers_mutex_ held.
  void uncount_locked(Peer& peer);

  std::mutex peers_mutex_;  // peers_, per_address_, open_, accepted_
  std::map<Peer*, std::unique_ptr<Peer>> peers_;
  std::map<std::string, int> per_address_;  // the counted (unauthenticated, unrefused) peers per address
  uint64_t accepted_ = 0;
  int open_ = 0;
  std::thread watchdog_;
  std::thread maintenance_;
  std::atomic<bool> running_{false};
  std::mutex stop_mutex_;
  std::condition_variable stopped_;
  bool stopped_flag_ = false;
  int port_ = 0;
};

}  // namespace yolo8::quota
