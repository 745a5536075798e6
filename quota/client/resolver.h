#pragma once
// Name lookup with a deadline: getaddrinfo has no timeout of its own, and a hung DNS server would hold a lease
// request or a heartbeat longer than the client's connect and read timeouts.
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace yolo8::quota {

// A blocking lookup: the host's addresses as numeric text (the preferred first). Throws std::runtime_error
// saying why when there are none.
using NameLookup = std::function<std::vector<std::string>(const std::string& host)>;

// The system's resolver (getaddrinfo: /etc/hosts, DNS, as nsswitch.conf says), TCP addresses of any family.
std::vector<std::string> system_lookup(const std::string& host);

// Whether `host` is an IPv4 or IPv6 address already (IPv6 with or without its brackets): nothing to look up.
bool is_numeric_host(const std::string& host);

struct Resolved {
  std::vector<std::string> addresses;  // empty: none (see error)
  bool from_cache = false;             // the lookup failed or ran late: the last good answer
  std::string error;                   // why this lookup gave nothing ("" when it did)
};

// Looks hosts up on a worker thread and waits for it at most a deadline; remembers each host's last good
// answer and falls back to it when a lookup fails or runs late. One lookup per host at a time: a call while one
// is still running (hung) waits for that one, so a hung resolver does not pile up threads.
class HostResolver {
 public:
  explicit HostResolver(NameLookup lookup = system_lookup);
  Resolved resolve(const std::string& host, double deadline_s);

 private:
  struct Pending;
  NameLookup lookup_;
  std::mutex mutex_;
  std::map<std::string, std::shared_ptr<Pending>> pending_;    // the lookup running for a host
  std::map<std::string, std::vector<std::string>> last_good_;  // each host's last answer
};

}  // namespace yolo8::quota
