#include "trainer/runtime/torch_warnings.h"

#include <iostream>

namespace yolo8 {

void OnceWarningHandler::process(const c10::Warning& warning) {
  // The message without LibTorch's source location, which differs between otherwise equal warnings.
  const std::string message = warning.msg();
  std::lock_guard<std::mutex> lock(mutex_);
  if (!seen_.insert(message).second) {
    ++repeats_;
    return;
  }
  out_ << "yolo8: LibTorch warning (shown once): " << message << std::endl;
}

int64_t OnceWarningHandler::repeats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return repeats_;
}

void print_each_torch_warning_once() {
  static OnceWarningHandler handler(std::cerr);
  c10::WarningUtils::set_warning_handler(&handler);
}

}  // namespace yolo8
