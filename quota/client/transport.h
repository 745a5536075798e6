#pragma once
// How the client reaches the quota API: one interface, two transports.
#include <memory>
#include <string>

#include "quota/client/bearer_token.h"
#include "quota/client/resolver.h"
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

struct HttpOptions {
  // Sent as "Authorization: Bearer"; when read from a file, a 401 reads it again and, when it changed (a rotation),
  // the request is sent once more with the new token. None: no header.
  std::shared_ptr<BearerToken> token;
  std::string ca_file;  // https: the CA (PEM) quotad's certificate chains to; empty: the system's
  HttpTimeouts timeouts;
  // Looks the host up within the connect timeout (a lookup that runs late reads as unreachable, status 0), its
  // last good answer kept. Shared by a client's connections; none: one of the connection's own.
  std::shared_ptr<HostResolver> resolver;
};

// A shared quotad at `url` (http://host:port or https://host:port). Over https the server's certificate must
// chain to the CA file when given, else to the system's CAs, and name the host; a certificate that fails the
// check answers status 0 with why ("certificate expired", and the URL).
std::unique_ptr<QuotaTransport> make_http_transport(const std::string& url, HttpOptions options);
// The same with a fixed token (none when empty).
std::unique_ptr<QuotaTransport> make_http_transport(const std::string& url, const std::string& token,
                                                    const std::string& ca_file = "", HttpTimeouts timeouts = {});

}  // namespace yolo8::quota
