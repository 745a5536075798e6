#pragma once
// The route table and dispatch: which route a method and path name, 404 and 405 with Allow before anyone is asked
// who calls, the caller authenticated for token routes, the {id} segment parsed, the route's handler called.
#include <cstdint>
#include <functional>
#include <string>
#include <variant>
#include <vector>

#include "quota/core/api.h"
#include "quota/service/auth_gate.h"

namespace yolo8::quota {

// Who may call a route: anyone (/healthz, /readyz), a bearer token (every /v1 call), or anyone for a page the HTTP
// front renders itself (/metrics, the status page; the embedded service answers those 404).
enum class RouteAccess { kOpen, kToken, kPage };
// Which workers answer a route: heartbeats and the probes never queue behind other calls or slow clients.
enum class RouteLane { kApi, kFast };

struct RouteSpec {
  std::string method;
  std::string pattern;  // "/v1/leases/{id}/heartbeat": {id} stands for one path segment
  RouteAccess access = RouteAccess::kToken;
  RouteLane lane = RouteLane::kApi;
};

// What the route table says about a method and path (the path without its query).
struct RouteMatch {
  int index = -1;       // into Router::routes(); -1 when no route answers this method on this path
  std::string allowed;  // the methods the path answers ("GET, POST"); "" for an unknown path (404)
  RouteLane lane() const;
  bool found() const { return index >= 0; }
};

const char* to_string(RouteAccess access);
const char* to_string(RouteLane lane);

class QuotaService;

class Router {
 public:
  using Parts = std::vector<std::string>;  // the path's segments
  // A route's handler: the caller (empty for open routes), the request, its path's segments, the {id} if any.
  using Handler = ApiResponse (*)(QuotaService&, const Caller&, const ApiRequest&, const Parts&, int64_t id);
  struct Route {
    RouteSpec spec;
    Handler handler;  // null for the HTTP front's pages
  };
  // The one route table: it drives routing, 405 with Allow, the HTTP front's lanes and pages, and the route
  // list in quota/README.md (a test compares them).
  static const std::vector<Route>& table();
  static const std::vector<RouteSpec>& routes();
  static RouteMatch match(const std::string& method, const std::string& path);

  // The caller of a request, or the answer refusing it (401, 429).
  using Authenticate = std::function<std::variant<Caller, ApiResponse>(const ApiRequest&)>;
  // Routes `req` (its path without the query): 404 for an unknown path or a page, 405 with Allow for a method
  // the path does not answer, both without authentication; then the caller, a malformed {id} 404, the handler.
  static ApiResponse dispatch(QuotaService& service, const ApiRequest& req, const Authenticate& authenticate);
  // The path's segments ("/v1/leases/7" -> v1, leases, 7).
  static Parts split_path(const std::string& path);
  // A lease, approval or loan id: digits only, so "12abc" or "-1" never name one.
  static bool parse_id(const std::string& text, int64_t& out);
};

}  // namespace yolo8::quota
