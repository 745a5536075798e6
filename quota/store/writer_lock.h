#pragma once
// One writer per SQLite database: `quotad serve` holds an exclusive lock on DB.lock beside the database for as long as
// it runs. A second quotad on the same file would expire the first one's running leases in the database while the
// first kept answering `granted`, and lock it out of writing; it now refuses to start, naming the holder. The lock
// is flock(2): the kernel drops it when the holder exits, however it exits (kill -9 included), so it never goes stale.
#include <string>

namespace yolo8::quota {

class WriterLock {
 public:
  // Takes the lock of `db_path` (DB.lock, created when missing) and records this process in it (pid, host, since);
  // throws std::runtime_error naming the database and the holder when another process holds it.
  explicit WriterLock(const std::string& db_path);
  ~WriterLock();
  WriterLock(const WriterLock&) = delete;
  WriterLock& operator=(const WriterLock&) = delete;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace yolo8::quota
