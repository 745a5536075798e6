#include "trainer/core/atomic_file.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <system_error>

namespace yolo8 {
namespace {

void remove_stale_temporaries(const std::filesystem::path& dir, const std::string& prefix) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string rest = name.substr(prefix.size());
    const auto dot = rest.find('.');
    long pid = 0;
    try {
      pid = std::stol(rest.substr(0, dot));
    } catch (const std::exception&) {
      continue;
    }
    // Ours from an earlier failed attempt, or a writer that no longer exists.
    if (pid == static_cast<long>(::getpid()) || (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH)) {
      std::filesystem::remove(entry.path(), ec);
    }
  }
}

[[noreturn]] void throw_errno(const std::string& what) {
  throw std::system_error(errno, std::generic_category(), what);
}

}  // namespace

void write_file_atomic(const std::string& path, const void* data, size_t size) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  if (target.filename().empty()) throw std::invalid_argument("write_file_atomic: '" + path + "' names no file");
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  const std::string prefix = "." + target.filename().string() + ".tmp.";
  remove_stale_temporaries(dir, prefix);
  static std::atomic<uint64_t> counter{0};
  const fs::path tmp = dir / (prefix + std::to_string(::getpid()) + "." + std::to_string(counter++));

  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) throw_errno("cannot create " + tmp.string());
  const char* p = static_cast<const char*>(data);
  size_t left = size;
  auto fail = [&](const std::string& what) {
    const int err = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    errno = err;
    throw_errno(what);
  };
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("cannot write " + tmp.string());
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  while (::fsync(fd) != 0) {
    if (errno != EINTR) fail("cannot fsync " + tmp.string());
  }
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    errno = err;
    throw_errno("cannot close " + tmp.string());
  }
  if (::rename(tmp.c_str(), target.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    errno = err;
    throw_errno("cannot rename " + tmp.string() + " to " + path);
  }
  // The rename is durable only once the folder entry is on disk.
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) throw_errno("cannot open folder " + dir.string());
  int rc;
  while ((rc = ::fsync(dfd)) != 0 && errno == EINTR) {
  }
  const int err = errno;
  ::close(dfd);
  if (rc != 0) {
    errno = err;
    throw_errno("cannot fsync folder " + dir.string());
  }
}

}  // namespace yolo8
