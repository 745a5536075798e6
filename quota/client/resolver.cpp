#include "quota/client/resolver.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <stdexcept>
#include <thread>

#include "quota/core/api.h"

namespace yolo8::quota {

std::vector<std::string> system_lookup(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int status = ::getaddrinfo(host.c_str(), nullptr, &hints, &found);
  if (status != 0) throw std::runtime_error(::gai_strerror(status));
  std::vector<std::string> addresses;
  for (const addrinfo* at = found; at != nullptr; at = at->ai_next) {
    char text[INET6_ADDRSTRLEN] = {0};
    const void* raw = at->ai_family == AF_INET6
                          ? static_cast<const void*>(&reinterpret_cast<const sockaddr_in6*>(at->ai_addr)->sin6_addr)
                          : static_cast<const void*>(&reinterpret_cast<const sockaddr_in*>(at->ai_addr)->sin_addr);
    if ((at->ai_family != AF_INET && at->ai_family != AF_INET6) ||
        ::inet_ntop(at->ai_family, raw, text, sizeof(text)) == nullptr) {
      continue;
    }
    if (std::find(addresses.begin(), addresses.end(), text) == addresses.end()) addresses.emplace_back(text);
  }
  ::freeaddrinfo(found);
  if (addresses.empty()) throw std::runtime_error("no IPv4 or IPv6 address");
  return addresses;
}

bool is_numeric_host(const std::string& host) {
  std::string bare = host;
  if (bare.size() > 2 && bare.front() == '[' && bare.back() == ']') bare = bare.substr(1, bare.size() - 2);
  unsigned char address[sizeof(in6_addr)];
  return ::inet_pton(AF_INET, bare.c_str(), address) == 1 || ::inet_pton(AF_INET6, bare.c_str(), address) == 1;
}

// One lookup's result, shared with its worker thread, which may outlive the wait (and the resolver).
struct HostResolver::Pending {
  std::mutex mutex;
  std::condition_variable done_signal;
  bool done = false;
  std::vector<std::string> addresses;
  std::string error;
};

HostResolver::HostResolver(NameLookup lookup) : lookup_(std::move(lookup)) {}

Resolved HostResolver::resolve(const std::string& host, double deadline_s) {
  if (is_numeric_host(host)) return Resolved{{host}, false, ""};
  std::shared_ptr<Pending> pending;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& running = pending_[host];
    if (running == nullptr) {
      running = std::make_shared<Pending>();
      // detached: a lookup that never returns must not hold the caller (nor the resolver's destruction)
      std::thread([lookup = lookup_, host, running] {
        std::vector<std::string> addresses;
        std::string error;
        try {
          addresses = lookup(host);
          if (addresses.empty()) error = "no address";
        } catch (const std::exception& failure) {
          error = failure.what();
        }
        std::lock_guard<std::mutex> done_lock(running->mutex);
        running->addresses = std::move(addresses);
        running->error = std::move(error);
        running->done = true;
        running->done_signal.notify_all();
      }).detach();
    }
    pending = running;
  }
  bool finished = false;
  Resolved resolved;
  {
    std::unique_lock<std::mutex> lock(pending->mutex);
    const auto wait = std::chrono::microseconds(static_cast<int64_t>(std::max(0.0, deadline_s) * 1e6));
    finished = pending->done_signal.wait_for(lock, wait, [&] { return pending->done; });
    if (finished) {
      resolved.addresses = pending->addresses;
      resolved.error = pending->error;
    } else {
      resolved.error = "no answer within " + fixed_text(deadline_s, 1) + " s";
    }
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (finished) {
    // the next call looks up afresh (an address that changed is picked up); this one is over
    const auto running = pending_.find(host);
    if (running != pending_.end() && running->second == pending) pending_.erase(running);
  }
  if (!resolved.addresses.empty()) {
    last_good_[host] = resolved.addresses;
  } else if (const auto last = last_good_.find(host); last != last_good_.end()) {
    resolved.addresses = last->second;
    resolved.from_cache = true;
  }
  return resolved;
}

}  // namespace yolo8::quota
