#include "quota/server/http_server.h"

#include <arpa/inet.h>
#include <gnutls/abstract.h>
#include <gnutls/gnutls.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>
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

int64_t steady_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string address_text(const sockaddr* address) {
  char text[INET6_ADDRSTRLEN] = {0};
  if (address == nullptr) return "";
  if (address->sa_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(address)->sin_addr, text, sizeof(text));
  } else if (address->sa_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(address)->sin6_addr, text, sizeof(text));
  }
  return text;
}

std::string error_body(int status, const std::string& reason) {
  return nlohmann::json{{"error", status}, {"reason", reason}}.dump();
}

struct HeadSize {
  int fields = 0;
  size_t bytes = 0;
  bool chunked = false;
};

MHD_Result count_header(void* cls, MHD_ValueKind, const char* key, const char* value) {
  auto& head = *static_cast<HeadSize*>(cls);
  ++head.fields;
  head.bytes += std::strlen(key) + (value != nullptr ? std::strlen(value) : 0) + 4;  // ": " and CRLF
  if (strcasecmp(key, MHD_HTTP_HEADER_TRANSFER_ENCODING) == 0) head.chunked = true;
  return MHD_YES;
}

MHD_Result collect_argument(void* cls, MHD_ValueKind, const char* key, const char* value) {
  static_cast<ApiRequest*>(cls)->query[key] = value != nullptr ? value : "";
  return MHD_YES;
}

}  // namespace

// What the server knows about one connection: its deadline and whether it has been refused.
struct QuotaServer::Peer {
  QuotaServer* server = nullptr;  // for the TLS handshake's certificate callback
  int fd = -1;
  std::string address;
  int64_t deadline_ms = 0;  // the request must be whole by then; 0 while one is being answered
  int64_t close_at_ms = 0;  // refused: closed for good then
  bool refused = false;
  bool counted = true;  // against its address's cap: no valid token seen yet, not refused
  // Admitted beyond its address's cap (every other unauthenticated connection of the address had a request in
  // flight): its first request is served only if it carries a valid token, else answered 429 and closed.
  bool over_cap = false;
  uint64_t order = 0;  // accept order: the oldest is refused first
  int served = 0;
};

// One request: what libmicrohttpd has handed over so far and, once a worker has run it, the answer.
struct QuotaServer::Exchange {
  MHD_Connection* connection = nullptr;
  Peer* peer = nullptr;
  ApiRequest request;
  int route = -1;  // into QuotaService::routes()
  RouteLane lane = RouteLane::kApi;
  bool queued = false;
  bool ready = false;  // the answer below is final
  ApiResponse answer;
  std::string content_type;
  std::string body;
};

// The connection's record, or null once libmicrohttpd has reported it closed. With peers_mutex_ held.
QuotaServer::Peer* QuotaServer::live_locked(Peer* peer) {
  return peer != nullptr && peers_.count(peer) != 0 ? peer : nullptr;
}

namespace {

int hex_value(char ch) {
  if (ch >= '0' && ch <= '9') return ch - '0';
  if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
  if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
  return -1;
}

// libmicrohttpd's own unescaping turns %00 into a NUL that ends the C string it hands over, so
// "/v1/teams/a%00b" would arrive as "/v1/teams/a". The same decoding, with %00 kept visible as 0x7f (a control
// character the request handler refuses).
size_t unescape_keeping_nul_visible(void* /*cls*/, MHD_Connection* /*connection*/, char* text) {
  char* out = text;
  for (const char* in = text; *in != '\0';) {
    const int high = in[0] == '%' ? hex_value(in[1]) : -1;
    const int low = high >= 0 ? hex_value(in[2]) : -1;
    if (low >= 0) {
      const int code = high * 16 + low;
      *out++ = code == 0 ? '\x7f' : static_cast<char>(code);
      in += 3;
    } else {
      *out++ = *in++;
    }
  }
  *out = '\0';
  return static_cast<size_t>(out - text);
}

bool has_control_character(const char* text) {
  for (; *text != '\0'; ++text) {
    const auto code = static_cast<unsigned char>(*text);
    if (code < 0x20 || code == 0x7f) return true;
  }
  return false;
}

}  // namespace

struct QuotaServer::Callbacks {
  static MHD_Result request(void* self, MHD_Connection* connection, const char* url, const char* method,
                            const char* version, const char* upload, size_t* upload_size, void** context) {
    return static_cast<QuotaServer*>(self)->request(connection, url, method, version, upload, upload_size, context)
               ? MHD_YES
               : MHD_NO;
  }
  static void completed(void* self, MHD_Connection*, void** context, MHD_RequestTerminationCode) {
    auto* exchange = static_cast<Exchange*>(*context);
    if (exchange == nullptr) return;
    auto& server = *static_cast<QuotaServer*>(self);
    {
      std::lock_guard<std::mutex> lock(server.peers_mutex_);
      if (Peer* peer = server.live_locked(exchange->peer); peer != nullptr && !peer->refused) {
        // the next request on this connection: whole within the keep-alive idle time and the request time
        peer->deadline_ms = steady_ms() + server.options_.keep_alive_idle_ms + server.options_.request_timeout_ms;
      }
    }
    delete exchange;
    *context = nullptr;
  }
  // GnuTLS asks at every handshake; libmicrohttpd set the session's pointer to its connection, whose socket
  // context is our Peer (set when the connection was accepted, before any TLS byte).
  static int certificate(gnutls_session_t session, const gnutls_datum_t*, int, const gnutls_pk_algorithm_t*, int,
                         gnutls_pcert_st** pcert, unsigned int* pcert_length, gnutls_privkey_t* pkey) {
    auto* connection = static_cast<MHD_Connection*>(gnutls_session_get_ptr(session));
    if (connection == nullptr) return -1;
    const MHD_ConnectionInfo* info = MHD_get_connection_info(connection, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    if (info == nullptr || info->socket_context == nullptr) return -1;
    const auto credentials = static_cast<Peer*>(info->socket_context)->server->tls_credentials();
    if (!credentials) return -1;
    void* chain = nullptr;
    void* key = nullptr;
    credentials->hand_over(&chain, pcert_length, &key);
    *pcert = static_cast<gnutls_pcert_st*>(chain);
    *pkey = static_cast<gnutls_privkey_t>(key);
    return 0;
  }
  static void connection(void* self, MHD_Connection* connection, void** socket_context,
                         MHD_ConnectionNotificationCode what) {
    auto& server = *static_cast<QuotaServer*>(self);
    if (what == MHD_CONNECTION_NOTIFY_STARTED) {
      server.connection_started(connection, socket_context);
    } else {
      server.connection_closed(socket_context);
    }
  }
};

std::string QuotaServer::over_cap_reason(const std::string& address) const {
  return "too many unauthenticated connections from " + address + " (at most " +
         std::to_string(options_.max_connections_per_client) + ")";
}

QuotaServer::QuotaServer(QuotaService& service, ServerOptions options)
    : service_(service), options_(std::move(options)), metrics_(service, options_.operations) {}

QuotaServer::~QuotaServer() { stop(); }

void QuotaServer::connection_started(MHD_Connection* connection, void** socket_context) {
  auto peer = std::make_unique<Peer>();
  peer->server = this;
  const MHD_ConnectionInfo* fd_info = MHD_get_connection_info(connection, MHD_CONNECTION_INFO_CONNECTION_FD);
  const MHD_ConnectionInfo* address_info = MHD_get_connection_info(connection, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
  peer->fd = fd_info != nullptr ? fd_info->connect_fd : -1;
  peer->address = address_info != nullptr ? address_text(address_info->client_addr) : "";
  peer->deadline_ms = steady_ms() + options_.request_timeout_ms;
  std::lock_guard<std::mutex> lock(peers_mutex_);
  Peer& ref = *peer;
  *socket_context = peer.get();
  peers_[peer.get()] = std::move(peer);
  ++open_;
  ref.order = ++accepted_;
  const int from_address = ++per_address_[ref.address];
  if (open_ > options_.max_connections) {
    refuse_locked(ref, 503, "Service Unavailable", "quotad has too many open connections; retry shortly");
  } else if (from_address > options_.max_connections_per_client) {
    // The newcomer may be a trainer about to send its token; the oldest unauthenticated connection still
    // waiting for a request (an idle socket of a flood) makes room. If every one of them has a request in
    // flight (answers a client does not read), the newcomer is admitted on probation: its request is served
    // if it carries a valid token, else answered 429 (a shared address never locks out a token).
    Peer* oldest = nullptr;
    for (auto& [key, other] : peers_) {
      if (other.get() != &ref && other->counted && other->deadline_ms != 0 && other->address == ref.address &&
          (oldest == nullptr || other->order < oldest->order)) {
        oldest = other.get();
      }
    }
    if (oldest != nullptr) {
      refuse_locked(*oldest, 429, "Too Many Requests", over_cap_reason(ref.address));
    } else {
      ref.over_cap = true;
    }
  }
}

void QuotaServer::uncount_locked(Peer& peer) {
  if (!peer.counted) return;
  peer.counted = false;
  auto it = per_address_.find(peer.address);
  if (it != per_address_.end() && --it->second <= 0) per_address_.erase(it);
}

void QuotaServer::connection_closed(void** socket_context) {
  auto* peer = static_cast<Peer*>(*socket_context);
  if (peer == nullptr) return;
  std::lock_guard<std::mutex> lock(peers_mutex_);
  uncount_locked(*peer);
  --open_;
  peers_.erase(peer);
  *socket_context = nullptr;
}

void QuotaServer::refuse_locked(Peer& peer, int status, const char* phrase, const std::string& reason) {
  if (peer.refused) return;
  peer.refused = true;
  uncount_locked(peer);
  peer.close_at_ms = steady_ms() + 2000;  // the client reads the answer while what it still sends drains
  if (!tls_ && peer.fd >= 0) {
    const std::string body = error_body(status, reason);
    const std::string answer = "HTTP/1.1 " + std::to_string(status) + " " + phrase +
                               "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
                               "\r\nConnection: close\r\n\r\n" + body;
    // MHD has written nothing on this connection yet: the socket's buffer takes these few hundred bytes
    [[maybe_unused]] const ssize_t sent = ::send(peer.fd, answer.data(), answer.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  }
  if (peer.fd >= 0) ::shutdown(peer.fd, SHUT_WR);
}

int QuotaServer::queue_answer(MHD_Connection* connection, Exchange& exchange) {
  const std::string body = exchange.body.empty() ? exchange.answer.serialized() : exchange.body;
  MHD_Response* response =
      MHD_create_response_from_buffer(body.size(), const_cast<char*>(body.data()), MHD_RESPMEM_MUST_COPY);
  if (response == nullptr) return 0;
  const std::string type = exchange.content_type.empty() ? exchange.answer.content_type : exchange.content_type;
  MHD_add_response_header(response, MHD_HTTP_HEADER_CONTENT_TYPE, type.c_str());
  for (const auto& [name, value] : exchange.answer.headers) {
    MHD_add_response_header(response, name.c_str(), value.c_str());
  }
  bool last = false;
  {
    std::lock_guard<std::mutex> lock(peers_mutex_);
    if (Peer* peer = live_locked(exchange.peer); peer != nullptr) {
      peer->deadline_ms = 0;  // answering: no 408 on top of the answer
      last = ++peer->served >= options_.max_requests_per_connection;
    }
  }
  if (last) MHD_add_response_header(response, MHD_HTTP_HEADER_CONNECTION, "close");
  const MHD_Result queued = MHD_queue_response(connection, static_cast<unsigned>(exchange.answer.status), response);
  MHD_destroy_response(response);
  return queued == MHD_YES ? 1 : 0;
}

int QuotaServer::request(MHD_Connection* connection, const char* url, const char* method, const char* version,
                         const char* upload, size_t* upload_size, void** context) {
  auto* exchange = static_cast<Exchange*>(*context);
  if (exchange == nullptr) {  // the head has arrived
    exchange = new Exchange();
    *context = exchange;
    exchange->connection = connection;
    const MHD_ConnectionInfo* info = MHD_get_connection_info(connection, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    exchange->peer = info != nullptr ? static_cast<Peer*>(info->socket_context) : nullptr;
    {
      std::lock_guard<std::mutex> lock(peers_mutex_);
      if (Peer* peer = live_locked(exchange->peer); peer != nullptr && peer->refused) return 0;  // answered: close
      if (Peer* peer = live_locked(exchange->peer); peer != nullptr) exchange->request.client_address = peer->address;
    }
    HeadSize head;
    head.bytes = std::strlen(method) + std::strlen(url) + std::strlen(version) + 4;
    MHD_get_connection_values(connection, MHD_HEADER_KIND, count_header, &head);
    const char* length_text = MHD_lookup_connection_value(connection, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    const unsigned long long length = length_text != nullptr ? std::strtoull(length_text, nullptr, 10) : 0;
    auto refuse = [&](int status, const std::string& reason) {
      exchange->answer = error_response(status, reason);
      exchange->ready = true;
    };
    if (head.fields > options_.max_headers) {
      refuse(431, "headers: more than " + std::to_string(options_.max_headers) + " header fields");
    } else if (head.bytes > options_.max_header_bytes) {
      refuse(431, "headers: larger than " + std::to_string(options_.max_header_bytes) + " bytes");
    } else if (head.chunked) {
      refuse(411, "Transfer-Encoding: not accepted; send Content-Length");
    } else if (length > options_.max_body_bytes) {
      refuse(413, "body: larger than the server accepts");
    } else if (has_control_character(url)) {
      refuse(400, "path: contains a control character or an encoded NUL (%00)");
    }
    if (exchange->ready) return queue_answer(connection, *exchange);
    ApiRequest& req = exchange->request;
    req.method = method;
    req.path = url;
    MHD_get_connection_values(connection, MHD_GET_ARGUMENT_KIND, collect_argument, &req);
    const char* auth = MHD_lookup_connection_value(connection, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    const std::string prefix = "Bearer ";
    if (auth != nullptr && std::strncmp(auth, prefix.c_str(), prefix.size()) == 0) req.token = auth + prefix.size();
    const char* key = MHD_lookup_connection_value(connection, MHD_HEADER_KIND, "Idempotency-Key");
    if (key != nullptr) req.idempotency_key = key;
    const RouteMatch match = QuotaService::match_route(req.method, req.path);
    exchange->route = match.index;
    exchange->lane = match.lane();
    return 1;
  }
  {
    std::lock_guard<std::mutex> lock(peers_mutex_);
    if (Peer* peer = live_locked(exchange->peer); peer != nullptr && peer->refused) return 0;
  }
  if (*upload_size > 0) {  // a piece of the body
    if (!exchange->ready) {
      if (exchange->request.body.size() + *upload_size > options_.max_body_bytes) {
        exchange->answer = error_response(413, "body: larger than the server accepts");
        exchange->ready = true;
      } else {
        exchange->request.body.append(upload, *upload_size);
      }
    }
    *upload_size = 0;
    return 1;
  }
  if (exchange->ready) return queue_answer(connection, *exchange);
  if (exchange->queued) return 1;  // not resumed before the worker is done; nothing to do
  // the request is whole: its lane's workers answer it while libmicrohttpd serves the other connections
  Lane& lane = exchange->lane == RouteLane::kFast ? fast_ : api_;
  std::unique_lock<std::mutex> lane_lock(lane.mutex);
  if (lane.jobs.size() >= options_.max_queued_requests || !running_) {
    lane_lock.unlock();
    exchange->answer = error_response(503, running_ ? "quotad is overloaded; retry shortly" : "quotad is stopping");
    exchange->ready = true;
    return queue_answer(connection, *exchange);
  }
  {
    std::lock_guard<std::mutex> lock(peers_mutex_);
    if (Peer* peer = live_locked(exchange->peer); peer != nullptr) peer->deadline_ms = 0;  // whole in time
  }
  exchange->queued = true;
  MHD_suspend_connection(connection);
  lane.jobs.push_back(exchange);
  lane.cv.notify_one();
  return 1;
}

void QuotaServer::work(Lane& lane) {
  const auto& routes = QuotaService::routes();
  while (true) {
    Exchange* exchange = nullptr;
    {
      std::unique_lock<std::mutex> lock(lane.mutex);
      lane.cv.wait(lock, [&] { return !lane.jobs.empty() || !running_; });
      if (lane.jobs.empty()) return;  // stopping, and every suspended request has been answered
      exchange = lane.jobs.front();
      lane.jobs.pop_front();
    }
    const RouteSpec* route = exchange->route >= 0 ? &routes[static_cast<size_t>(exchange->route)] : nullptr;
    bool counted = false;
    {
      std::lock_guard<std::mutex> lock(peers_mutex_);
      if (Peer* peer = live_locked(exchange->peer); peer != nullptr) counted = peer->counted;
    }
    // once per connection: a valid token takes it off its address's cap (the lookup runs here, not in
    // libmicrohttpd's one thread)
    bool over_cap = false;
    if (counted) {
      const bool valid = !exchange->request.token.empty() && service_.accepts_token(exchange->request.token);
      std::lock_guard<std::mutex> lock(peers_mutex_);
      if (Peer* peer = live_locked(exchange->peer); peer != nullptr) {
        if (valid) uncount_locked(*peer);
        over_cap = !valid && peer->over_cap;
        peer->over_cap = false;
      }
    }
    try {
      if (over_cap) {
        exchange->answer = error_response(429, over_cap_reason(exchange->request.client_address));
        exchange->answer.headers["Connection"] = "close";
      } else if (route != nullptr && route->access == RouteAccess::kPage) {
        // the pages: names of teams, users and jobs and figures, never tokens
        if (route->pattern == "/metrics") {
          exchange->body = metrics_.text();
          exchange->content_type = "text/plain; version=0.0.4";
        } else if (route->pattern == "/favicon.ico") {
          exchange->body = favicon_ico();
          exchange->content_type = "image/x-icon";
        } else {
          exchange->body = render_status_page(service_);
          exchange->content_type = "text/html; charset=utf-8";
        }
      } else {
        exchange->answer = service_.handle(exchange->request);
      }
    } catch (const std::exception&) {
      exchange->body.clear();
      exchange->answer = error_response(500, "internal error");
    }
    exchange->ready = true;
    MHD_resume_connection(exchange->connection);
  }
}

void QuotaServer::watch() {
  while (running_) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const int64_t now = steady_ms();
    std::lock_guard<std::mutex> lock(peers_mutex_);
    for (auto& [key, peer] : peers_) {
      if (peer->refused) {
        // drained long enough: libmicrohttpd sees the end and closes the connection
        if (now >= peer->close_at_ms && peer->fd >= 0) ::shutdown(peer->fd, SHUT_RDWR);
      } else if (peer->deadline_ms != 0 && now >= peer->deadline_ms) {
        refuse_locked(*peer, 408, "Request Timeout",
                      "the request did not arrive whole within " + std::to_string(options_.request_timeout_ms) + " ms");
      }
    }
  }
}

int QuotaServer::start() {
  const bool tls = !options_.tls_cert_file.empty() || !options_.tls_key_file.empty();
  if (tls) {
    if (options_.tls_cert_file.empty() || options_.tls_key_file.empty()) {
      throw std::runtime_error("--tls-cert and --tls-key: give both or neither");
    }
    tls_ = true;
    reload_tls();
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string port_text = std::to_string(options_.port);
  if (::getaddrinfo(options_.host.c_str(), port_text.c_str(), &hints, &found) != 0 || found == nullptr) {
    throw std::runtime_error("cannot listen on " + options_.host + ":" + port_text + ": unknown host");
  }
  sockaddr_storage address{};
  std::memcpy(&address, found->ai_addr, found->ai_addrlen);
  ::freeaddrinfo(found);

  running_ = true;
  for (int i = 0; i < std::max(1, options_.threads); ++i) api_.workers.emplace_back([this] { work(api_); });
  for (int i = 0; i < std::max(1, options_.fast_threads); ++i) fast_.workers.emplace_back([this] { work(fast_); });
  unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME;
  if (address.ss_family == AF_INET6) flags |= MHD_USE_IPv6;
  if (tls) flags |= MHD_USE_TLS;
  // kept alive longer than it is idle: libmicrohttpd's connection timeout closes idle connections and
  // connections whose client stopped reading an answer
  const unsigned idle_s = static_cast<unsigned>(std::max(1, (options_.keep_alive_idle_ms + 999) / 1000));
  // the head is read into one pool per connection: room for the header cap, then 431
  const size_t memory = options_.max_header_bytes * 2 + 16 * 1024;
  // typed first, so a callback whose signature drifts from libmicrohttpd's does not compile
  const MHD_RequestCompletedCallback completed = &Callbacks::completed;
  const MHD_NotifyConnectionCallback notify = &Callbacks::connection;
  size_t (*const unescape)(void*, MHD_Connection*, char*) = &unescape_keeping_nul_visible;
  std::vector<MHD_OptionItem> items = {
      {MHD_OPTION_SOCK_ADDR, 0, &address},
      {MHD_OPTION_CONNECTION_TIMEOUT, idle_s, nullptr},
      {MHD_OPTION_CONNECTION_MEMORY_LIMIT, static_cast<intptr_t>(memory), nullptr},
      // ours answers 503 first; this is the hard stop
      {MHD_OPTION_CONNECTION_LIMIT, options_.max_connections + 64, nullptr},
      {MHD_OPTION_LISTEN_BACKLOG_SIZE, 1024, nullptr},
      {MHD_OPTION_NOTIFY_COMPLETED, reinterpret_cast<intptr_t>(completed), this},
      {MHD_OPTION_NOTIFY_CONNECTION, reinterpret_cast<intptr_t>(notify), this},
      {MHD_OPTION_UNESCAPE_CALLBACK, reinterpret_cast<intptr_t>(unescape), nullptr},
  };
  items.push_back({MHD_OPTION_END, 0, nullptr});
  // the certificate is asked for at each handshake (Callbacks::certificate), so reload_tls() needs no restart
  gnutls_certificate_retrieve_function2* const retrieve = &Callbacks::certificate;
  daemon_ =
      tls ? MHD_start_daemon(flags, static_cast<uint16_t>(options_.port), nullptr, nullptr, &Callbacks::request, this,
                             MHD_OPTION_ARRAY, items.data(), MHD_OPTION_HTTPS_CERT_CALLBACK, retrieve, MHD_OPTION_END)
          : MHD_start_daemon(flags, static_cast<uint16_t>(options_.port), nullptr, nullptr, &Callbacks::request, this,
                             MHD_OPTION_ARRAY, items.data(), MHD_OPTION_END);
  if (daemon_ == nullptr) {
    running_ = false;
    for (Lane* lane : {&api_, &fast_}) {
      lane->cv.notify_all();
      for (auto& worker : lane->workers) worker.join();
      lane->workers.clear();
    }
    throw std::runtime_error("cannot listen on " + options_.host + ":" + port_text +
                             (tls ? " (or the TLS certificate and key do not match)" : ""));
  }
  const MHD_DaemonInfo* bound = MHD_get_daemon_info(daemon_, MHD_DAEMON_INFO_BIND_PORT);
  port_ = bound != nullptr ? bound->port : options_.port;
  watchdog_ = std::thread([this] { watch(); });
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
  return port_;
}

CertificateFacts QuotaServer::reload_tls() {
  auto fresh = TlsCredentials::load(options_.tls_cert_file, options_.tls_key_file);
  std::lock_guard<std::mutex> lock(tls_mutex_);
  if (credentials_) retired_credentials_.push_back(credentials_);
  credentials_ = fresh;
  return fresh->facts();
}

std::shared_ptr<const TlsCredentials> QuotaServer::tls_credentials() const {
  std::lock_guard<std::mutex> lock(tls_mutex_);
  return credentials_;
}

void QuotaServer::stop() {
  if (!running_.exchange(false)) return;
  // no new connections; the workers answer what is queued (resuming each request), then end
  const int listen_fd = MHD_quiesce_daemon(daemon_);  // ours to close from now on
  for (Lane* lane : {&api_, &fast_}) {
    {
      std::lock_guard<std::mutex> lock(lane->mutex);
      lane->cv.notify_all();
    }
    for (auto& worker : lane->workers) worker.join();
    lane->workers.clear();
  }
  if (watchdog_.joinable()) watchdog_.join();
  MHD_stop_daemon(daemon_);
  daemon_ = nullptr;
  if (listen_fd >= 0) ::close(listen_fd);
  if (maintenance_.joinable()) maintenance_.join();
  {
    std::lock_guard<std::mutex> lock(stop_mutex_);
    stopped_flag_ = true;
  }
  stopped_.notify_all();
}

void QuotaServer::wait() {
  std::unique_lock<std::mutex> lock(stop_mutex_);
  stopped_.wait(lock, [&] { return stopped_flag_; });
}

}  // namespace yolo8::quota
