#include "quota/server/http_server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <chrono>
#include <stdexcept>

#include "quota/server/status_page.h"

namespace yolo8::quota {

void parse_listen(const std::string& listen, std::string& host, int& port) {
  const auto colon = listen.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    throw std::invalid_argument("--listen: '" + listen + "' is not HOST:PORT");
  }
  host = listen.substr(0, colon);
  const std::string port_text = listen.substr(colon + 1);
  if (port_text.empty() || port_text.size() > 5 || port_text.find_first_not_of("0123456789") != std::string::npos ||
      std::stoi(port_text) > 65535) {
    throw std::invalid_argument("--listen: port '" + port_text + "' is not a number within 0..65535");
  }
  port = std::stoi(port_text);
}

namespace {

ApiRequest to_api(const httplib::Request& req) {
  ApiRequest request;
  request.method = req.method;
  request.path = req.path;
  request.body = req.body;
  for (const auto& [name, value] : req.params) request.query[name] = value;
  const std::string auth = req.get_header_value("Authorization");
  const std::string prefix = "Bearer ";
  if (auth.size() > prefix.size() && auth.compare(0, prefix.size(), prefix) == 0) {
    request.token = auth.substr(prefix.size());
  }
  request.idempotency_key = req.get_header_value("Idempotency-Key");
  return request;
}

}  // namespace

QuotaServer::QuotaServer(QuotaService& service, ServerOptions options)
    : service_(service),
      options_(std::move(options)),
      metrics_(service),
      server_(std::make_unique<httplib::Server>()) {}

QuotaServer::~QuotaServer() { stop(); }

int QuotaServer::start() {
  auto& server = *server_;
  const int threads = options_.threads;
  server.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  server.set_payload_max_length(options_.max_body_bytes);
  server.set_tcp_nodelay(true);  // small keep-alive replies must not wait for delayed ACKs
  server.set_keep_alive_max_count(1000000);
  // idle keep-alive connections pin a worker each; let them go quickly
  server.set_keep_alive_timeout(2);
  server.set_read_timeout(10, 0);
  server.set_write_timeout(10, 0);
  auto handler = [this](const httplib::Request& req, httplib::Response& res) {
    const ApiResponse response = service_.handle(to_api(req));
    res.status = response.status;
    res.set_content(response.serialized(), response.content_type.c_str());
  };
  // The read-only pages, token-free: names of teams, users and jobs, never tokens.
  server.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics_.text(), "text/plain; version=0.0.4");
  });
  const auto status_page = [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(render_status_page(service_), "text/html; charset=utf-8");
  };
  server.Get("/", status_page);
  server.Get("/status", status_page);
  server.Get("/favicon.ico",
             [](const httplib::Request&, httplib::Response& res) { res.set_content(favicon_ico(), "image/x-icon"); });
  server.Post(R"(/(metrics|status)?)", [](const httplib::Request&, httplib::Response& res) {
    res.status = 405;
    res.set_header("Allow", "GET");
  });
  server.Get(R"(/.*)", handler);
  server.Post(R"(/.*)", handler);
  server.set_error_handler([](const httplib::Request&, httplib::Response& res) {
    if (!res.body.empty()) return;
    std::string reason = "request rejected";
    if (res.status == 413) reason = "body: larger than the server accepts";
    if (res.status == 400) reason = "malformed HTTP request";
    if (res.status == 404) reason = "no such endpoint";
    if (res.status == 405) reason = "method not allowed";
    res.set_content(nlohmann::json{{"error", res.status}, {"reason", reason}}.dump(), "application/json");
  });
  server.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
    res.status = 500;
    res.set_content(R"({"error":500,"reason":"internal error"})", "application/json");
  });
  // cpp-httplib 0.11 listens with a backlog of 5, which resets bursts of connections; remember the socket
  // so the backlog can be raised after bind
  server.set_socket_options([this](socket_t sock) {
    httplib::default_socket_options(sock);
    listen_fd_ = static_cast<int>(sock);
  });
  port_ = options_.port == 0 ? server.bind_to_any_port(options_.host)
                             : (server.bind_to_port(options_.host, options_.port) ? options_.port : -1);
  if (port_ <= 0) {
    throw std::runtime_error("cannot listen on " + options_.host + ":" + std::to_string(options_.port));
  }
  if (listen_fd_ >= 0) ::listen(listen_fd_, 1024);
  running_ = true;
  listener_ = std::thread([this] { server_->listen_after_bind(); });
  maintenance_ = std::thread([this] {
    auto next_tick = std::chrono::steady_clock::now();
    while (running_) {
      std::this_thread::sleep_for(std::chrono::milliseconds(options_.flush_ms));
      try {
        service_.flush_heartbeats();
        if (std::chrono::steady_clock::now() >= next_tick) {
          service_.tick();
          next_tick += std::chrono::milliseconds(options_.tick_ms);
        }
      } catch (const std::exception&) {
        // storage trouble: keep serving; the next round retries
      }
    }
    try {
      service_.flush_heartbeats();
    } catch (const std::exception&) {
    }
  });
  for (int i = 0; i < 5000 && !server_->is_running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return port_;
}

void QuotaServer::stop() {
  if (!running_.exchange(false)) return;
  server_->stop();
  if (listener_.joinable()) listener_.join();
  if (maintenance_.joinable()) maintenance_.join();
}

void QuotaServer::wait() {
  if (listener_.joinable()) listener_.join();
}

}  // namespace yolo8::quota
