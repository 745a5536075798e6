#include "quota/server/http_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <stdexcept>
#include <vector>

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

// httplib's server with the socket handed to the gate instead of a worker; serve() runs httplib's own request
// parsing and routing on a request the gate has already read whole.
class GatedServer : public httplib::Server {
 public:
  void set_admit(std::function<void(int)> admit) { admit_ = std::move(admit); }
  bool serve(httplib::Stream& stream, bool close_connection, bool& connection_closed) {
    return process_request(stream, close_connection, connection_closed, nullptr);
  }

 private:
  bool process_and_close_socket(socket_t sock) override {
    admit_(static_cast<int>(sock));
    return true;
  }
  std::function<void(int)> admit_;
};

namespace {

int64_t steady_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string address_text(const sockaddr_storage& address, int* port) {
  char text[INET6_ADDRSTRLEN] = {0};
  if (address.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&address);
    inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text));
    if (port != nullptr) *port = ntohs(in->sin_port);
  } else if (address.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&address);
    inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof(text));
    if (port != nullptr) *port = ntohs(in6->sin6_port);
  }
  return text;
}

// Writes all of `data` to a non-blocking socket, waiting at most `timeout_ms` in total.
bool send_all(int fd, const char* data, size_t size, int timeout_ms) {
  const int64_t deadline = steady_ms() + timeout_ms;
  size_t sent = 0;
  while (sent < size) {
    const ssize_t n = ::send(fd, data + sent, size - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      const int64_t left = deadline - steady_ms();
      if (left <= 0) return false;
      pollfd waiting{fd, POLLOUT, 0};
      ::poll(&waiting, 1, static_cast<int>(left));
      continue;
    }
    return false;
  }
  return true;
}

// One request, already read whole, as the stream httplib parses; the answer goes straight to the socket.
class BufferStream : public httplib::Stream {
 public:
  BufferStream(int fd, std::string request, int write_timeout_ms)
      : fd_(fd), request_(std::move(request)), write_timeout_ms_(write_timeout_ms) {}
  bool is_readable() const override { return pos_ < request_.size(); }
  bool is_writable() const override { return true; }
  ssize_t read(char* ptr, size_t size) override {
    const size_t n = std::min(size, request_.size() - pos_);
    std::memcpy(ptr, request_.data() + pos_, n);
    pos_ += n;
    return static_cast<ssize_t>(n);
  }
  ssize_t write(const char* ptr, size_t size) override {
    return send_all(fd_, ptr, size, write_timeout_ms_) ? static_cast<ssize_t>(size) : -1;
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage address{};
    socklen_t length = sizeof(address);
    ::getpeername(fd_, reinterpret_cast<sockaddr*>(&address), &length);
    ip = address_text(address, &port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage address{};
    socklen_t length = sizeof(address);
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &length);
    ip = address_text(address, &port);
  }
  socket_t socket() const override { return fd_; }

 private:
  int fd_;
  std::string request_;
  size_t pos_ = 0;
  int write_timeout_ms_;
};

// httplib's accept loop hands each socket straight to the gate (no worker involved).
class InlineQueue : public httplib::TaskQueue {
 public:
  void enqueue(std::function<void()> fn) override { fn(); }
  void shutdown() override {}
};

bool iequals_prefix(const std::string& text, size_t pos, const char* word) {
  for (size_t i = 0; word[i] != 0; ++i) {
    if (pos + i >= text.size() || std::tolower(static_cast<unsigned char>(text[pos + i])) != word[i]) return false;
  }
  return true;
}

}  // namespace

class RequestGate {
 public:
  RequestGate(const ServerOptions& options, GatedServer& server) : options_(options), server_(server) {}
  ~RequestGate() { stop(); }

  void start() {
    epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
    wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (epoll_fd_ < 0 || wake_fd_ < 0) throw std::runtime_error("cannot create the request gate (epoll)");
    epoll_event event{};
    event.events = EPOLLIN;
    event.data.fd = wake_fd_;
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &event);
    running_ = true;
    for (int i = 0; i < std::max(1, options_.threads); ++i) workers_.emplace_back([this] { work(main_); });
    for (int i = 0; i < std::max(1, options_.fast_threads); ++i) workers_.emplace_back([this] { work(fast_); });
    io_ = std::thread([this] { loop(); });
  }

  void stop() {
    if (!running_.exchange(false)) return;
    wake();
    if (io_.joinable()) io_.join();
    for (Pool* pool : {&main_, &fast_}) {
      std::lock_guard<std::mutex> lock(pool->mutex);
      pool->cv.notify_all();
    }
    for (auto& worker : workers_) worker.join();
    for (Pool* pool : {&main_, &fast_}) {
      for (auto& job : pool->jobs) ::close(job.conn->fd);
      pool->jobs.clear();
    }
    std::lock_guard<std::mutex> lock(mutex_);
    for (int fd : incoming_) ::close(fd);
    for (auto& conn : returning_) ::close(conn->fd);
    incoming_.clear();
    returning_.clear();
    for (auto& [fd, conn] : conns_) ::close(fd);
    conns_.clear();
    ::close(epoll_fd_);
    ::close(wake_fd_);
  }

  // From httplib's accept loop.
  void admit(int fd) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!running_) {
        ::close(fd);
        return;
      }
      incoming_.push_back(fd);
    }
    wake();
  }

 private:
  struct Conn {
    int fd = -1;
    std::string peer;
    std::string buffer;
    int64_t deadline_ms = 0;
    bool in_request = false;  // bytes of a request have arrived
    bool draining = false;    // answered with an error: discard input until the deadline, then close
    int served = 0;
    bool keep = true;  // set by the worker
  };
  struct Job {
    std::unique_ptr<Conn> conn;
    std::string request;
  };
  struct Pool {
    std::mutex mutex;
    std::condition_variable cv;
    std::deque<Job> jobs;
  };
  static constexpr size_t kMaxQueuedJobs = 10000;

  void wake() {
    const uint64_t one = 1;
    [[maybe_unused]] const ssize_t n = ::write(wake_fd_, &one, sizeof(one));
  }

  void watch(Conn& conn) {
    epoll_event event{};
    event.events = EPOLLIN | EPOLLRDHUP;
    event.data.fd = conn.fd;
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, conn.fd, &event);
  }

  void close_conn(int fd) {
    auto it = conns_.find(fd);
    if (it == conns_.end()) return;
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
    release_peer(it->second->peer);
    ::close(fd);
    conns_.erase(it);
  }

  void release_peer(const std::string& peer) {
    auto it = per_peer_.find(peer);
    if (it != per_peer_.end() && --it->second <= 0) per_peer_.erase(it);
    --open_;
  }

  // An error answer written by the gate itself; the connection then drains and closes.
  void refuse(Conn& conn, int status, const char* phrase, const std::string& reason) {
    const std::string body = nlohmann::json{{"error", status}, {"reason", reason}}.dump();
    const std::string response =
        "HTTP/1.1 " + std::to_string(status) + " " + phrase +
        "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
        "\r\nConnection: close\r\n\r\n" + body;
    send_all(conn.fd, response.data(), response.size(), 200);
    ::shutdown(conn.fd, SHUT_WR);
    conn.draining = true;
    conn.buffer.clear();
    conn.buffer.shrink_to_fit();
    conn.deadline_ms = steady_ms() + 2000;
  }

  void take_incoming() {
    std::vector<int> fds;
    std::vector<std::unique_ptr<Conn>> back;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      fds.swap(incoming_);
      back.swap(returning_);
    }
    const int64_t now = steady_ms();
    for (int fd : fds) {
      auto conn = std::make_unique<Conn>();
      conn->fd = fd;
      sockaddr_storage address{};
      socklen_t length = sizeof(address);
      ::getpeername(fd, reinterpret_cast<sockaddr*>(&address), &length);
      conn->peer = address_text(address, nullptr);
      ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
      conn->deadline_ms = now + options_.request_timeout_ms;
      ++open_;
      const int peer_count = ++per_peer_[conn->peer];
      Conn& ref = *conn;
      conns_[fd] = std::move(conn);
      watch(ref);
      if (open_ > options_.max_connections) {
        refuse(ref, 503, "Service Unavailable", "quotad has too many open connections; retry shortly");
      } else if (peer_count > options_.max_connections_per_client) {
        refuse(ref, 429, "Too Many Requests",
               "too many connections from " + ref.peer + " (at most " +
                   std::to_string(options_.max_connections_per_client) + ")");
      }
    }
    for (auto& conn : back) {
      const int fd = conn->fd;
      if (!conn->keep || !running_) {
        release_peer(conn->peer);
        ::close(fd);
        continue;
      }
      conn->in_request = !conn->buffer.empty();
      conn->deadline_ms = now + (conn->in_request ? options_.request_timeout_ms : options_.keep_alive_idle_ms);
      Conn& ref = *conn;
      conns_[fd] = std::move(conn);
      watch(ref);
      if (ref.in_request) evaluate(ref);  // a pipelined request
    }
  }

  void on_readable(Conn& conn) {
    char chunk[16384];
    const size_t cap = options_.max_header_bytes + options_.max_body_bytes + 1;
    while (true) {
      const ssize_t n = ::recv(conn.fd, chunk, sizeof(chunk), 0);
      if (n > 0) {
        if (conn.draining) continue;  // discarded: bounded by the drain deadline
        if (!conn.in_request) {
          conn.in_request = true;
          conn.deadline_ms = steady_ms() + options_.request_timeout_ms;
        }
        conn.buffer.append(chunk, static_cast<size_t>(n));
        if (conn.buffer.size() > cap) break;
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      close_conn(conn.fd);  // closed by the peer, or an error
      return;
    }
    if (!conn.draining) evaluate(conn);
  }

  // Dispatches the buffered request once it is whole; refuses it as soon as it breaks a limit.
  void evaluate(Conn& conn) {
    const size_t head_end = conn.buffer.find("\r\n\r\n");
    if (head_end == std::string::npos) {
      if (conn.buffer.size() > options_.max_header_bytes) {
        refuse(conn, 431, "Request Header Fields Too Large",
               "headers: larger than " + std::to_string(options_.max_header_bytes) + " bytes");
      }
      return;
    }
    const size_t head_size = head_end + 4;
    if (head_size > options_.max_header_bytes) {
      refuse(conn, 431, "Request Header Fields Too Large",
             "headers: larger than " + std::to_string(options_.max_header_bytes) + " bytes");
      return;
    }
    int lines = 0;
    size_t content_length = 0;
    bool chunked = false;
    for (size_t pos = conn.buffer.find("\r\n"); pos < head_end; pos = conn.buffer.find("\r\n", pos + 2)) {
      ++lines;
      const size_t start = pos + 2;
      if (iequals_prefix(conn.buffer, start, "content-length:")) {
        const std::string value = conn.buffer.substr(start + 15, conn.buffer.find("\r\n", start) - start - 15);
        const size_t first = value.find_first_not_of(' ');
        if (first == std::string::npos || value.find_first_not_of("0123456789 ", first) != std::string::npos ||
            value.size() - first > 12) {
          refuse(conn, 400, "Bad Request", "Content-Length: not a number");
          return;
        }
        content_length = static_cast<size_t>(std::stoull(value.substr(first)));
      } else if (iequals_prefix(conn.buffer, start, "transfer-encoding:")) {
        chunked = true;
      }
    }
    if (lines > options_.max_headers) {
      refuse(conn, 431, "Request Header Fields Too Large",
             "headers: more than " + std::to_string(options_.max_headers) + " header fields");
      return;
    }
    if (chunked) {
      refuse(conn, 411, "Length Required", "Transfer-Encoding: not accepted; send Content-Length");
      return;
    }
    if (content_length > options_.max_body_bytes) {
      refuse(conn, 413, "Payload Too Large", "body: larger than the server accepts");
      return;
    }
    if (conn.buffer.size() < head_size + content_length) return;  // the body is still arriving
    // the route table names the lane: heartbeats and the health check never queue behind other calls
    const std::string request_line = conn.buffer.substr(0, conn.buffer.find("\r\n"));
    const size_t method_end = request_line.find(' ');
    const size_t target_end = request_line.find(' ', method_end + 1);
    const std::string target = method_end == std::string::npos
                                   ? std::string()
                                   : request_line.substr(method_end + 1, target_end - method_end - 1);
    const bool fast =
        QuotaService::match_route(request_line.substr(0, method_end), target.substr(0, target.find('?'))).lane() ==
        RouteLane::kFast;
    Job job;
    job.request = conn.buffer.substr(0, head_size + content_length);
    conn.buffer.erase(0, head_size + content_length);
    const int fd = conn.fd;
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
    job.conn = std::move(conns_.at(fd));
    conns_.erase(fd);
    Pool& pool = fast ? fast_ : main_;
    std::unique_lock<std::mutex> lock(pool.mutex);
    if (pool.jobs.size() >= kMaxQueuedJobs) {
      lock.unlock();
      Conn& back = *job.conn;
      conns_[fd] = std::move(job.conn);
      watch(back);
      refuse(back, 503, "Service Unavailable", "quotad is overloaded; retry shortly");
      return;
    }
    pool.jobs.push_back(std::move(job));
    pool.cv.notify_one();
  }

  void loop() {
    std::vector<epoll_event> events(256);
    while (running_) {
      const int n = ::epoll_wait(epoll_fd_, events.data(), static_cast<int>(events.size()), 100);
      for (int i = 0; i < n; ++i) {
        const int fd = events[static_cast<size_t>(i)].data.fd;
        if (fd == wake_fd_) {
          uint64_t count = 0;
          [[maybe_unused]] const ssize_t r = ::read(wake_fd_, &count, sizeof(count));
          take_incoming();
          continue;
        }
        auto it = conns_.find(fd);
        if (it != conns_.end()) on_readable(*it->second);
      }
      // deadlines: an idle keep-alive connection closes quietly, a request still arriving gets 408
      const int64_t now = steady_ms();
      std::vector<int> expired;
      for (auto& [fd, conn] : conns_) {
        if (now >= conn->deadline_ms) expired.push_back(fd);
      }
      for (int fd : expired) {
        Conn& conn = *conns_.at(fd);
        if (conn.in_request && !conn.draining) {
          refuse(conn, 408, "Request Timeout",
                 "the request did not arrive whole within " + std::to_string(options_.request_timeout_ms) + " ms");
          conn.deadline_ms = now + 200;  // let the answer leave, then close
        } else {
          close_conn(fd);
        }
      }
    }
  }

  void work(Pool& pool) {
    while (true) {
      Job job;
      {
        std::unique_lock<std::mutex> lock(pool.mutex);
        pool.cv.wait(lock, [&] { return !pool.jobs.empty() || !running_; });
        if (!running_) return;
        job = std::move(pool.jobs.front());
        pool.jobs.pop_front();
      }
      Conn& conn = *job.conn;
      BufferStream stream(conn.fd, std::move(job.request), options_.write_timeout_ms);
      bool closed = false;
      const bool last = ++conn.served >= options_.max_requests_per_connection;
      const bool ok = server_.serve(stream, last, closed);
      conn.keep = ok && !closed && !last;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        returning_.push_back(std::move(job.conn));
      }
      wake();
    }
  }

  const ServerOptions& options_;
  GatedServer& server_;
  std::atomic<bool> running_{false};
  int epoll_fd_ = -1;
  int wake_fd_ = -1;
  std::thread io_;
  std::vector<std::thread> workers_;
  Pool main_, fast_;
  std::mutex mutex_;  // incoming_ and returning_
  std::vector<int> incoming_;
  std::vector<std::unique_ptr<Conn>> returning_;
  // the gate thread's own
  std::map<int, std::unique_ptr<Conn>> conns_;
  std::map<std::string, int> per_peer_;
  int open_ = 0;
};

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
  request.client_address = req.remote_addr;
  return request;
}

}  // namespace

QuotaServer::QuotaServer(QuotaService& service, ServerOptions options)
    : service_(service),
      options_(std::move(options)),
      metrics_(service),
      server_(std::make_unique<GatedServer>()),
      gate_(std::make_unique<RequestGate>(options_, *server_)) {}

QuotaServer::~QuotaServer() { stop(); }

int QuotaServer::start() {
  auto& server = *server_;
  // accepted sockets go to the gate at once; the gate's workers run httplib's parsing on whole requests
  server.new_task_queue = [] { return new InlineQueue(); };
  server.set_admit([this](int fd) { gate_->admit(fd); });
  server.set_payload_max_length(options_.max_body_bytes);
  server.set_tcp_nodelay(true);  // small keep-alive replies must not wait for delayed ACKs
  auto handler = [this](const httplib::Request& req, httplib::Response& res) {
    const ApiResponse response = service_.handle(to_api(req));
    res.status = response.status;
    for (const auto& [name, value] : response.headers) res.set_header(name.c_str(), value);
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
  // every other method and path reaches the service, which answers 404, or 405 with Allow from the route table
  server.Get(R"(/.*)", handler);
  server.Post(R"(/.*)", handler);
  server.Put(R"(/.*)", handler);
  server.Patch(R"(/.*)", handler);
  server.Delete(R"(/.*)", handler);
  server.Options(R"(/.*)", handler);
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
  gate_->start();
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
  gate_->stop();
  if (maintenance_.joinable()) maintenance_.join();
}

void QuotaServer::wait() {
  if (listener_.joinable()) listener_.join();
}

}  // namespace yolo8::quota
