#pragma once
// quotad's HTTP front: cpp-httplib on a thread pool, forwarding to QuotaService, plus the maintenance thread
// (ticks every second, flushes heartbeat batches).
#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "quota/server/metrics.h"
#include "quota/service/service.h"

namespace httplib {
class Server;
}

namespace yolo8::quota {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;                       // 0: an ephemeral port
  size_t max_body_bytes = 64 * 1024;  // larger bodies get 413
  int threads = 64;
  int tick_ms = 1000;
  int flush_ms = 200;
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
  std::unique_ptr<httplib::Server> server_;
  std::thread listener_;
  std::thread maintenance_;
  std::atomic<bool> running_{false};
  int port_ = 0;
  int listen_fd_ = -1;
};

}  // namespace yolo8::quota
