#include "quota/store/writer_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <stdexcept>
#include <string>

namespace yolo8::quota {

namespace {

std::string holder_of(int fd) {
  char text[256] = {};
  const ssize_t n = pread(fd, text, sizeof(text) - 1, 0);
  std::string holder = n > 0 ? std::string(text, static_cast<size_t>(n)) : std::string();
  while (!holder.empty() && (holder.back() == '\n' || holder.back() == '\0')) holder.pop_back();
  return holder.empty() ? "a process that has not written its name yet" : holder;
}

}  // namespace

WriterLock::WriterLock(const std::string& db_path) : path_(db_path + ".lock") {
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    throw std::runtime_error("cannot open the writer lock " + path_ + ": " + std::strerror(errno));
  }
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    const std::string holder = error == EWOULDBLOCK ? holder_of(fd_) : std::string(std::strerror(error));
    ::close(fd_);
    fd_ = -1;
    if (error == EWOULDBLOCK) {
      throw std::runtime_error("the database " + db_path + " is served by another quotad (" + holder +
                               "): one quotad per database; stop that one first or give this one another --db");
    }
    throw std::runtime_error("cannot lock " + path_ + ": " + holder);
  }
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) std::strcpy(host, "unknown host");
  char since[32] = {};
  const std::time_t now = std::time(nullptr);
  std::strftime(since, sizeof(since), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  const std::string me = "pid " + std::to_string(::getpid()) + " on " + host + " since " + since + "\n";
  // Best effort: the lock itself is what excludes; the text only names the holder in the refusal.
  if (::ftruncate(fd_, 0) == 0) {
    (void)::pwrite(fd_, me.data(), me.size(), 0);
  }
}

WriterLock::~WriterLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the descriptor releases the lock
}

}  // namespace yolo8::quota
