#include "quota/service/router.h"

#include "quota/service/service.h"

namespace yolo8::quota {

namespace {

// Segment by segment; "{id}" takes any one segment (a malformed id is the handler's 404, after authorization).
bool pattern_matches(const Router::Parts& pattern, const Router::Parts& parts) {
  if (pattern.size() != parts.size()) return false;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (pattern[i] != "{id}" && pattern[i] != parts[i]) return false;
  }
  return true;
}

}  // namespace

const char* to_string(RouteAccess access) {
  switch (access) {
    case RouteAccess::kOpen: return "open";
    case RouteAccess::kToken: return "token";
    case RouteAccess::kPage: return "page";
  }
  return "?";
}

const char* to_string(RouteLane lane) { return lane == RouteLane::kFast ? "fast" : "api"; }

RouteLane RouteMatch::lane() const {
  return found() ? Router::routes()[static_cast<size_t>(index)].lane : RouteLane::kApi;
}

Router::Parts Router::split_path(const std::string& path) {
  Parts parts;
  std::string current;
  for (char ch : path) {
    if (ch == '/') {
      if (!current.empty()) parts.push_back(current);
      current.clear();
    } else {
      current += ch;
    }
  }
  if (!current.empty()) parts.push_back(current);
  return parts;
}

bool Router::parse_id(const std::string& text, int64_t& out) {
  if (text.empty() || text.size() > 15) return false;
  for (char ch : text) {
    if (ch < '0' || ch > '9') return false;
  }
  out = std::stoll(text);
  return out > 0;
}

const std::vector<Router::Route>& Router::table() {
  using S = QuotaService;
  using P = Parts;
  constexpr auto kOpen = RouteAccess::kOpen;
  constexpr auto kToken = RouteAccess::kToken;
  constexpr auto kPage = RouteAccess::kPage;
  constexpr auto kApi = RouteLane::kApi;
  constexpr auto kFast = RouteLane::kFast;
  // the ledger's calls dispatch further on the path in ledger_api.cpp
  const Handler ledger = [](S& s, const Caller& c, const ApiRequest& r, const P& p, int64_t) {
    return s.ledger_route(c, r, p);
  };
  static const std::vector<Route> table = {
      {{"GET", "/v1/leases", kToken, kApi},
       [](S& s, const Caller& c, const ApiRequest& r, const P&, int64_t) { return s.list_leases(c, r); }},
      {{"POST", "/v1/leases", kToken, kApi},
       [](S& s, const Caller& c, const ApiRequest& r, const P&, int64_t) { return s.acquire(c, r); }},
      {{"GET", "/v1/leases/{id}", kToken, kApi},
       [](S& s, const Caller& c, const ApiRequest&, const P&, int64_t id) { return s.get_lease(c, id); }},
      {{"POST", "/v1/leases/{id}/heartbeat", kToken, kFast},
       [](S& s, const Caller& c, const ApiRequest& r, const P&, int64_t id) { return s.heartbeat(c, id, r.body); }},
      {{"POST", "/v1/leases/{id}/reattach", kToken, kApi},
       [](S& s, const Caller& c, const ApiRequest& r, const P&, int64_t id) { return s.reattach(c, id, r.body); }},
      {{"POST", "/v1/leases/{id}/release", kToken, kApi},
       [](S& s, const Caller& c, const ApiRequest& r, const P&, int64_t id) { return s.release(c, id, r.body); }},
      {{"POST", "/v1/leases/{id}/review", kToken, kApi},
       [](S& s, const Caller& c, const ApiRequest& r, const P&, int64_t id) { return s.review(c, id, r.body); }},
      {{"GET", "/v1/approvals", kToken, kApi},
       [](S& s, const Caller& c, const ApiRequest&, const P&, int64_t) { return s.list_approvals(c); }},
      {{"POST", "/v1/approvals/{id}/approve", kToken, kApi},
       [](S& s, const Caller& c, const ApiRequest& r, const P&, int64_t id) { return s.decide(c, id, true, r.body); }},
      {{"POST", "/v1/approvals/{id}/reject", kToken, kApi},
       [](S& s, const Caller& c, const ApiRequest& r, const P&, int64_t id) { return s.decide(c, id, false, r.body); }},
      {{"GET", "/v1/teams", kToken, kApi},
       [](S& s, const Caller& c, const ApiRequest&, const P&, int64_t) { return s.teams(c); }},
      {{"GET", "/v1/queue", kToken, kApi},
       [](S& s, const Caller& c, const ApiRequest&, const P&, int64_t) { return s.queue(c); }},
      {{"GET", "/v1/audit", kToken, kApi},
       [](S& s, const Caller& c, const ApiRequest& r, const P&, int64_t) { return s.audit(c, r); }},
      {{"GET", "/v1/loans", kToken, kApi}, ledger},
      {{"POST", "/v1/loans", kToken, kApi}, ledger},
      {{"GET", "/v1/loans/{id}", kToken, kApi}, ledger},
      {{"POST", "/v1/loans/{id}/approve", kToken, kApi}, ledger},
      {{"POST", "/v1/loans/{id}/reject", kToken, kApi}, ledger},
      {{"GET", "/v1/credits", kToken, kApi}, ledger},
      {{"POST", "/v1/credits", kToken, kApi}, ledger},
      {{"GET", "/v1/balance", kToken, kApi}, ledger},
      {{"GET", "/healthz", kOpen, kFast},
       [](S& s, const Caller&, const ApiRequest&, const P&, int64_t) { return s.healthz(); }},
      {{"GET", "/readyz", kOpen, kFast},
       [](S& s, const Caller&, const ApiRequest&, const P&, int64_t) { return s.readyz(); }},
      {{"GET", "/metrics", kPage, kApi}, nullptr},
      {{"GET", "/", kPage, kApi}, nullptr},
      {{"GET", "/status", kPage, kApi}, nullptr},
      {{"GET", "/favicon.ico", kPage, kApi}, nullptr},
  };
  return table;
}

const std::vector<RouteSpec>& Router::routes() {
  static const std::vector<RouteSpec> specs = [] {
    std::vector<RouteSpec> out;
    for (const Route& route : table()) out.push_back(route.spec);
    return out;
  }();
  return specs;
}

RouteMatch Router::match(const std::string& method, const std::string& path) {
  const Parts parts = split_path(path);
  RouteMatch match;
  const auto& routes = table();
  for (size_t i = 0; i < routes.size(); ++i) {
    if (!pattern_matches(split_path(routes[i].spec.pattern), parts)) continue;
    const std::string& route_method = routes[i].spec.method;
    if (match.allowed.find(route_method) == std::string::npos) {
      match.allowed += (match.allowed.empty() ? "" : ", ") + route_method;
    }
    if (route_method == method && match.index < 0) match.index = static_cast<int>(i);
  }
  return match;
}

ApiResponse Router::dispatch(QuotaService& service, const ApiRequest& req, const Authenticate& authenticate) {
  const RouteMatch found = match(req.method, req.path);
  const Route* route = found.found() ? &table()[static_cast<size_t>(found.index)] : nullptr;
  if (found.allowed.empty() || (route != nullptr && route->spec.access == RouteAccess::kPage)) {
    // the caller's path and method are not echoed: answers stay small whatever was sent
    return error_response(404, "no such endpoint (the routes are listed in quota/README.md)");
  }
  if (route == nullptr) {
    ApiResponse response = error_response(405, "method not allowed on this path (allowed: " + found.allowed + ")");
    response.headers["Allow"] = found.allowed;
    return response;
  }
  const Parts parts = split_path(req.path);
  if (route->spec.access == RouteAccess::kOpen) return route->handler(service, Caller{}, req, parts, 0);
  std::variant<Caller, ApiResponse> who = authenticate(req);
  if (auto* refusal = std::get_if<ApiResponse>(&who)) return std::move(*refusal);
  int64_t id = 0;
  if (route->spec.pattern.find("{id}") != std::string::npos && !parse_id(parts[2], id)) {
    // "leases" -> "unknown lease: ids are positive numbers"
    return error_response(404, "unknown " + parts[1].substr(0, parts[1].size() - 1) + ": ids are positive numbers");
  }
  return route->handler(service, std::get<Caller>(who), req, parts, id);
}

}  // namespace yolo8::quota
