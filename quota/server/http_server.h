#pragma once
// quotad's HTTP front, forwarding to QuotaService, plus the maintenance thread (ticks every second, flushes
// heartbeat batches). cpp-httplib 0.11 accepts connections and parses complete requests; in between, a gate
// (one epoll thread) reads every request whole, under a deadline and size caps, before any worker sees it, so
// slow or hostile clients never hold a worker. Heartbeats and /healthz have their own workers.
#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "quota/server/metrics.h"
#include "quota/service/service.h"

namespace yolo8::quota {

class RequestGate;
class GatedServer;

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;                       // 0: an ephemeral port
  size_t max_body_bytes = 64 * 1024;  // larger bodies get 413
  int threads = 64;                   // workers for the API and the pages
  int fast_threads = 4;               // workers for heartbeats and /healthz only
  int tick_ms = 1000;
  int flush_ms = 200;
  // The gate: a request (head and body) must arrive whole within request_timeout_ms of its first byte (of the
  // connection for the first request), else 408 and the connection closes; an idle keep-alive connection is
  // closed after keep_alive_idle_ms; heads over max_header_bytes or max_headers get 431.
  int request_timeout_ms = 5000;
  int keep_alive_idle_ms = 5000;
  int max_requests_per_connection = 1000;
  size_t max_header_bytes = 16 * 1024;
  int max_headers = 64;
  int max_connections_per_client = 32;  // per peer address; more are closed at once
  int max_connections = 4096;
  int write_timeout_ms = 10000;
};

// "HOST:PORT" -> host, port; throws std::invalid_argument naming the value.
void parse_listen(const std::string& listen, std::string& host, int& port);

class QuotaServer {
 public:
  QuotaServer(QuotaService& service, ServerOptions options);
  ~QuotaServer();
  // Binds and serves in the background; returns the bound port. Throws if the address cannot be bound.
  int start();
  void stop();
  // Blocks until stop() (or a signal handler calling stop()).
  void wait();
  int port() const { return port_; }

 private:
  QuotaService& service_;
  ServerOptions options_;
  MetricsExporter metrics_;
  std::unique_ptr<GatedServer> server_;
  std::unique_ptr<RequestGate> gate_;
  std::thread listener_;
  std::thread maintenance_;
  std::atomic<bool> running_{false};
  int port_ = 0;
  int listen_fd_ = -1;
};

}  // namespace yolo8::quota
