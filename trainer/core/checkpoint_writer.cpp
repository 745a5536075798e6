#include "trainer/core/checkpoint_writer.h"

#include <memory>
#include <stdexcept>
#include <utility>

#include "trainer/core/atomic_file.h"
#include "trainer/core/checkpoint.h"

namespace yolo8 {

CheckpointWriter::CheckpointWriter(std::function<void(const std::string&)> on_written)
    : on_written_(std::move(on_written)), thread_([this] { run(); }) {}

CheckpointWriter::~CheckpointWriter() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    closing_ = true;
  }
  work_.notify_one();
  thread_.join();  // the thread empties the queue before it leaves
}

void CheckpointWriter::write(std::string path, std::vector<char> bytes) {
  auto held = std::make_shared<std::vector<char>>(std::move(bytes));
  write(std::move(path), [held] { return std::move(*held); });
}

void CheckpointWriter::write(std::string path, std::function<std::vector<char>()> encode) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(File{std::move(path), std::move(encode)});
  }
  work_.notify_one();
}

void CheckpointWriter::wait() {
  std::unique_lock<std::mutex> lock(mutex_);
  idle_.wait(lock, [this] { return queue_.empty() && !writing_; });
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

size_t CheckpointWriter::pending() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return queue_.size() + (writing_ ? 1 : 0);
}

// The bytes of a queued file; an encoder's failure names the file, as a failed write does.
std::vector<char> CheckpointWriter::encoded(File& file) {
  try {
    return file.encode();
  } catch (const std::exception& e) {
    throw std::runtime_error("cannot encode checkpoint " + file.path + ": " + e.what());
  }
}

void CheckpointWriter::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    work_.wait(lock, [this] { return closing_ || !queue_.empty(); });
    if (queue_.empty()) return;  // closing, nothing left
    File file = std::move(queue_.front());
    queue_.pop_front();
    writing_ = true;
    lock.unlock();
    std::exception_ptr failure;
    try {
      const std::vector<char> bytes = encoded(file);
      write_file_atomic(file.path, bytes.data(), bytes.size());
      if (on_written_) on_written_(file.path);
    } catch (...) {
      failure = std::current_exception();
    }
    file.encode = nullptr;  // what it holds (bytes, a snapshot) goes now, not at the next file
    lock.lock();
    writing_ = false;
    if (failure && !error_) error_ = failure;
    idle_.notify_all();
  }
}

}  // namespace yolo8
