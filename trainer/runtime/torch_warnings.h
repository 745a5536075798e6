#pragma once
// LibTorch 2.x warns on every call for some conditions (an op without a deterministic CUDA kernel under
// deterministic=true, say): thousands of identical lines per epoch. This handler prints each distinct warning once.

#include <c10/util/Exception.h>

#include <mutex>
#include <ostream>
#include <set>
#include <string>

namespace yolo8 {

class OnceWarningHandler : public c10::WarningHandler {
 public:
  explicit OnceWarningHandler(std::ostream& out) : out_(out) {}
  void process(const c10::Warning& warning) override;
  // Warnings suppressed so far (repeats of one already printed).
  int64_t repeats() const;

 private:
  std::ostream& out_;
  mutable std::mutex mutex_;
  std::set<std::string> seen_;
  int64_t repeats_ = 0;
};

// Installs one process-wide OnceWarningHandler writing to stderr (main calls it first).
void print_each_torch_warning_once();

}  // namespace yolo8
