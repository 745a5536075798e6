#pragma once
// Peak memory of a training step: on CPU an instrumented allocator counts live tensor bytes,
// on CUDA the caching allocator's own statistics are read. Same interface for both.

#include <c10/core/Device.h>

#include <cstdint>
#include <exception>
#include <stdexcept>
#include <string>

namespace yolo8 {

// Raised by the instrumented CPU allocator when an allocation would exceed its byte cap, and by
// tests to inject a failure; the message always contains "out of memory".
class OutOfMemory : public std::runtime_error {
 public:
  explicit OutOfMemory(const std::string& message, int64_t requested_bytes = 0);
  int64_t requested_bytes() const { return requested_bytes_; }

 private:
  int64_t requested_bytes_;
};

// True for our OutOfMemory, c10's OutOfMemoryError, any error whose message says "out of memory" (CUDA and the
// autograd engine may rethrow with a rewrapped message), and cuBLAS's and cuDNN's allocation failures
// (CUBLAS_STATUS_ALLOC_FAILED, CUDNN_STATUS_ALLOC_FAILED, "unable to find an engine" for lack of workspace).
bool is_out_of_memory(const std::exception& error);
// The same for the exception in flight; false when it is not a std::exception.
bool is_out_of_memory(const std::exception_ptr& error);

// Process-wide switches of the instrumented CPU allocator. Installing is idempotent; tensors
// allocated before installation keep their own deleter and are freed untouched (and uncounted).
void install_cpu_memory_counter();
// Puts the previous CPU allocator back; blocks still alive stay counted until freed.
void uninstall_cpu_memory_counter();
bool cpu_memory_counter_installed();
// Allocations that would take live counted bytes above `bytes` throw OutOfMemory; 0 removes the cap.
void set_cpu_memory_cap(int64_t bytes);
int64_t cpu_memory_cap();

struct MemoryStats {
  int64_t current_bytes = 0;   // live tensor bytes
  int64_t peak_bytes = 0;      // max of current since the last reset
  int64_t reserved_bytes = 0;  // held from the system (CUDA cache); equals current on CPU
  int64_t reserved_peak_bytes = 0;
};

// Reads live and peak tensor memory of one device. On CPU constructing it installs the counter.
class MemoryMeter {
 public:
  explicit MemoryMeter(c10::Device device = c10::Device(c10::kCPU));

  void reset_peak();
  int64_t current_bytes() const;
  int64_t peak_bytes() const;
  int64_t reserved_bytes() const;
  int64_t reserved_peak_bytes() const;
  MemoryStats stats() const;
  const c10::Device& device() const { return device_; }

 private:
  c10::Device device_;
};

// Caps what the CUDA caching allocator may hold on `device` to `fraction` of the device's memory,
// so a job cannot grow into a neighbour's share. Throws std::runtime_error in a build without CUDA.
void cap_process_memory(double fraction, int device);
// Total memory of a CUDA device in bytes; throws in a build without CUDA.
int64_t cuda_device_total_bytes(int device);
// Caps memory of `device` at `bytes`: CUDA through cap_process_memory with bytes / device total
// (at most 1), CPU through the instrumented allocator's cap (installing it). Throws
// std::invalid_argument for bytes <= 0.
void cap_memory_bytes(int64_t bytes, const c10::Device& device);
// Budget when none is given (quota=off, gpu_mem=0): the CUDA device's total memory, or the
// machine's physical memory on CPU.
int64_t default_memory_budget_bytes(const c10::Device& device);
// Returns cached, unused CUDA blocks to the driver after an out-of-memory; no-op on CPU.
void release_cached_memory(const c10::Device& device);

}  // namespace yolo8
