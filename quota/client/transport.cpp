#include "quota/client/transport.h"

#include <httplib.h>
#include <openssl/x509.h>

#include <chrono>
#include <mutex>
#include <vector>

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

// The host part of an http(s)://host[:port] URL as httplib reads it (an IPv6 address without its brackets).
std::string host_of(const std::string& url) {
  const size_t begin = url.find("://") == std::string::npos ? 0 : url.find("://") + 3;
  if (begin < url.size() && url[begin] == '[') return url.substr(begin + 1, url.find(']', begin) - begin - 1);
  return url.substr(begin, url.find_first_of(":/", begin) - begin);
}

// Why the server's certificate was not accepted, from OpenSSL's verify result (X509_V_OK: it does not name the
// host).
std::string certificate_problem(long verify_result, const std::string& url) {
  if (verify_result == X509_V_ERR_CERT_HAS_EXPIRED) {
    return "certificate expired: the TLS certificate " + url + " serves is past its notAfter date (renew it)";
  }
  if (verify_result == X509_V_OK)
    return "certificate rejected: the TLS certificate " + url + " serves is not for " + host_of(url);
  return std::string("certificate rejected: the TLS certificate ") + url +
         " serves: " + X509_verify_cert_error_string(verify_result);
}

ApiResponse no_answer(const std::string& why) {
  ApiResponse response;
  response.status = 0;
  response.body = json{{"reason", why}};
  return response;
}

class HttpTransport : public QuotaTransport {
 public:
  HttpTransport(const std::string& url, HttpOptions options)
      : client_(url), url_(url), host_(host_of(url)), options_(std::move(options)) {
    if (!options_.resolver) options_.resolver = std::make_shared<HostResolver>();
    if (!options_.ca_file.empty()) client_.set_ca_cert_path(options_.ca_file.c_str());
    client_.enable_server_certificate_verification(true);
    const auto microseconds = [](double seconds) {
      return std::chrono::microseconds(static_cast<int64_t>(seconds * 1e6));
    };
    client_.set_connection_timeout(microseconds(options_.timeouts.connect_s));
    client_.set_read_timeout(microseconds(options_.timeouts.read_write_s));
    client_.set_write_timeout(microseconds(options_.timeouts.read_write_s));
    // heartbeats come every few seconds: a held keep-alive connection would only pin a server worker
    client_.set_keep_alive(false);
    client_.set_tcp_nodelay(true);
  }

  ApiResponse call(const ApiRequest& request) override {
    std::lock_guard<std::mutex> lock(mu_);
    // httplib's own lookup has no deadline: the addresses come from the resolver, within the connect timeout
    std::vector<std::string> addresses;  // none: the host is an address
    if (!is_numeric_host(host_)) {
      Resolved resolved = options_.resolver->resolve(host_, options_.timeouts.connect_s);
      if (resolved.addresses.empty()) return no_answer("name lookup of " + host_ + " failed: " + resolved.error);
      addresses = std::move(resolved.addresses);
    }
    const std::string token = options_.token ? options_.token->value() : "";
    ApiResponse response = send_to_any(request, token, addresses);
    if (response.status != 401 || !options_.token || options_.token->file().empty()) return response;
    // a rotated Secret: quotad takes the new token (the old one only until the overlap ends); another connection
    // of the client may have read it already, so the retry is whenever the token differs from the one sent
    std::string error;
    options_.token->reload(&error);
    if (const std::string current = options_.token->value(); current != token) {
      response = send_to_any(request, current, addresses);
      if (response.status != 401) return response;
    }
    std::string reason = response.body.is_object() ? response.body.value("reason", "") : "";
    reason += std::string(reason.empty() ? "" : " ") + "(the token of " + options_.token->file() +
              (error.empty() ? "" : ", which could not be read again: " + error) + ")";
    response.body["reason"] = reason;
    return response;
  }

  // httplib's stop() shuts the socket of the request in flight down, so its wait for the answer ends now.
  void cancel() override { client_.stop(); }

 private:
  // Sends to the host's addresses in turn, from the one that took the last call, while they refuse the connection
  // (as httplib does with the addresses of its own lookup).
  ApiResponse send_to_any(const ApiRequest& request, const std::string& token,
                          const std::vector<std::string>& addresses) {
    if (addresses.empty()) return send(request, token);
    ApiResponse response;
    for (size_t tried = 0; tried < addresses.size(); ++tried) {
      client_.set_hostname_addr_map({{host_, addresses[address_index_ % addresses.size()]}});
      response = send(request, token);
      if (!connection_failed_) break;
      ++address_index_;
    }
    return response;
  }

  ApiResponse send(const ApiRequest& request, const std::string& token) {
    httplib::Headers headers;
    if (!token.empty()) headers.emplace("Authorization", "Bearer " + token);
    if (!request.idempotency_key.empty()) headers.emplace("Idempotency-Key", request.idempotency_key);
    httplib::Result result = request.method == "GET"
                                 ? client_.Get(request.path.c_str(), headers)
                                 : client_.Post(request.path.c_str(), headers, request.body, "application/json");
    if (!result) {
      const httplib::Error error = result.error();
      connection_failed_ = error == httplib::Error::Connection || error == httplib::Error::ConnectionTimeout;
      if (error == httplib::Error::SSLServerVerification) {
        return no_answer(certificate_problem(client_.get_openssl_verify_result(), url_));
      }
      return no_answer("no answer: " + httplib::to_string(error));  // unreachable, or no answer in time
    }
    connection_failed_ = false;
    ApiResponse response;
    response.status = result->status;
    if (result->has_header("Retry-After")) response.headers["Retry-After"] = result->get_header_value("Retry-After");
    try {
      response.body = json::parse(result->body);
    } catch (const json::exception&) {
      response.body = json{{"reason", result->body}};
    }
    return response;
  }

  std::mutex mu_;
  httplib::Client client_;
  std::string url_;
  std::string host_;
  HttpOptions options_;
  size_t address_index_ = 0;        // which of the host's addresses to try first
  bool connection_failed_ = false;  // the last send could not connect
};

}  // namespace

std::unique_ptr<QuotaTransport> make_local_transport(Policy policy, const ServiceOptions& options,
                                                     const std::string& user) {
  return std::make_unique<LocalTransport>(std::move(policy), options, user);
}

std::unique_ptr<QuotaTransport> make_http_transport(const std::string& url, HttpOptions options) {
  return std::make_unique<HttpTransport>(url, std::move(options));
}

std::unique_ptr<QuotaTransport> make_http_transport(const std::string& url, const std::string& token,
                                                    const std::string& ca_file, HttpTimeouts timeouts) {
  HttpOptions options;
  options.token = std::make_shared<BearerToken>(token);
  options.ca_file = ca_file;
  options.timeouts = timeouts;
  return make_http_transport(url, std::move(options));
}

}  // namespace yolo8::quota
