#pragma once
// How the client reaches the quota API: one interface, two transports.
#include <memory>
#include <string>

#include "quota/core/api.h"
#include "quota/core/policy.h"
#include "quota/service/service.h"

namespace yolo8::quota {

class QuotaTransport {
 public:
  virtual ~QuotaTransport() = default;
  // Never throws for a refusal: status 0 means the service could not be reached or did not answer in time.
  virtual ApiResponse call(const ApiRequest& request) = 0;
  // Ends a call in flight on another thread at once (it answers status 0); later calls go ahead as usual.
  virtual void cancel() {}
};

// How long an HTTP call may take: to connect, and for each read or write of it. A quotad that accepts and never
// answers (stopped, hung) thus reads as an unreachable one.
struct HttpTimeouts {
  double connect_s = 2.0;
  double read_write_s = 5.0;
};

// The embedded service (local mode): its state in a SQLite file that processes on one machine share; every call
// acts as `user` without a token.
std::unique_ptr<QuotaTransport> make_local_transport(Policy policy, const ServiceOptions& options,
                                                     const std::string& user);

// A shared quotad at `url` (http://host:port or https://host:port), with a bearer token when not empty. Over
// https the server's certificate must chain to `ca_file` (PEM) when given, else to the system's CAs, and name
// the host.
std::unique_ptr<QuotaTransport> make_http_transport(const std::string& url, const std::string& token,
                                                    const std::string& ca_file = "", HttpTimeouts timeouts = {});

}  // namespace yolo8::quota
