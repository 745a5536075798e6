#pragma once
// Writes checkpoints on a thread of its own, in the order given, each with write_file_atomic: the training loop
// hands over bytes, or a snapshot of its state to encode (snapshot_checkpoint: taken on the loop's thread, so it is
// consistent), and goes on while this thread encodes and the disk takes the bytes and the fsyncs. A run waits for it
// where a file must be on disk: before the next epoch's files (so at most one epoch's files are ever pending, and a
// write error surfaces one epoch later at most), before reading a file back, before saying that a checkpoint was
// written, and before it exits.
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace yolo8 {

class CheckpointWriter {
 public:
  // `on_written` runs on the writer's thread after each file is durable (path as given).
  explicit CheckpointWriter(std::function<void(const std::string&)> on_written = {});
  // Waits for every file given; an error nobody waited for is dropped (the previous file stays at its path).
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Queues `bytes` to replace `path` atomically.
  void write(std::string path, std::vector<char> bytes);
  // The same with the bytes `encode` returns, called on the writer's thread; what it throws fails that file.
  void write(std::string path, std::function<std::vector<char>()> encode);
  // Blocks until every file given so far is on disk (or failed); rethrows the first failure since the last wait,
  // after which the writer takes files again.
  void wait();
  // Files given and not yet on disk.
  size_t pending() const;

 private:
  struct File {
    std::string path;
    std::function<std::vector<char>()> encode;
  };
  static std::vector<char> encoded(File& file);
  void run();

  std::function<void(const std::string&)> on_written_;
  mutable std::mutex mutex_;
  std::condition_variable work_;  // a file was queued, or the writer is closing
  std::condition_variable idle_;  // a file was written or failed
  std::deque<File> queue_;
  bool writing_ = false;
  bool closing_ = false;
  std::exception_ptr error_;
  std::thread thread_;  // last: started once the members above exist
};

}  // namespace yolo8
