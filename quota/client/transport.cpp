#include "quota/client/transport.h"

#include <httplib.h>

#include <chrono>
#include <mutex>

namespace yolo8::quota {
namespace {

using nlohmann::json;

class LocalTransport : public QuotaTransport {
 public:
  LocalTransport(Policy policy, const ServiceOptions& options, std::string user)
      : service_(std::move(policy), options), user_(std::move(user)) {}

  ApiResponse call(const ApiRequest& request) override {
    ApiRequest trusted = request;
    trusted.trusted_user = user_;
    return service_.handle(trusted);
  }

 private:
  QuotaService service_;
  std::string user_;
};

class HttpTransport : public QuotaTransport {
 public:
  HttpTransport(const std::string& url, std::string token, const std::string& ca_file, HttpTimeouts timeouts)
      : client_(url), token_(std::move(token)) {
    if (!ca_file.empty()) client_.set_ca_cert_path(ca_file.c_str());
    client_.enable_server_certificate_verification(true);
    const auto microseconds = [](double seconds) {
      return std::chrono::microseconds(static_cast<int64_t>(seconds * 1e6));
    };
    client_.set_connection_timeout(microseconds(timeouts.connect_s));
    client_.set_read_timeout(microseconds(timeouts.read_write_s));
    client_.set_write_timeout(microseconds(timeouts.read_write_s));
    // heartbeats come every few seconds: a held keep-alive connection would only pin a server worker
    client_.set_keep_alive(false);
    client_.set_tcp_nodelay(true);
  }

  ApiResponse call(const ApiRequest& request) override {
    std::lock_guard<std::mutex> lock(mu_);
    httplib::Headers headers;
    if (!token_.empty()) headers.emplace("Authorization", "Bearer " + token_);
    if (!request.idempotency_key.empty()) headers.emplace("Idempotency-Key", request.idempotency_key);
    httplib::Result result = request.method == "GET"
                                 ? client_.Get(request.path.c_str(), headers)
                                 : client_.Post(request.path.c_str(), headers, request.body, "application/json");
    ApiResponse response;
    if (!result) {
      response.status = 0;  // unreachable (Connection), or no answer in time (Read)
      response.body = json{{"reason", "no answer: " + httplib::to_string(result.error())}};
      return response;
    }
    response.status = result->status;
    if (result->has_header("Retry-After")) response.headers["Retry-After"] = result->get_header_value("Retry-After");
    try {
      response.body = json::parse(result->body);
    } catch (const json::exception&) {
      response.body = json{{"reason", result->body}};
    }
    return response;
  }

  // httplib's stop() shuts the socket of the request in flight down, so its wait for the answer ends now.
  void cancel() override { client_.stop(); }

 private:
  std::mutex mu_;
  httplib::Client client_;
  std::string token_;
};

}  // namespace

std::unique_ptr<QuotaTransport> make_local_transport(Policy policy, const ServiceOptions& options,
                                                     const std::string& user) {
  return std::make_unique<LocalTransport>(std::move(policy), options, user);
}

std::unique_ptr<QuotaTransport> make_http_transport(const std::string& url, const std::string& token,
                                                    const std::string& ca_file, HttpTimeouts timeouts) {
  return std::make_unique<HttpTransport>(url, token, ca_file, timeouts);
}

}  // namespace yolo8::quota
