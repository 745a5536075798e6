#include "trainer/core/memory_meter.h"

#include <unistd.h>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <cstdio>
#include <memory>
#include <mutex>
#include <unordered_map>

#ifdef YOLO8_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace yolo8 {

namespace {

std::string format_mib(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return text;
}

// Counters live outside the allocator object so that blocks freed after uninstalling still count down.
std::atomic<int64_t> g_current_bytes{0};
std::atomic<int64_t> g_peak_bytes{0};
std::atomic<int64_t> g_cap_bytes{0};

void raise_peak(int64_t now) {
  int64_t seen = g_peak_bytes.load(std::memory_order_relaxed);
  while (now > seen && !g_peak_bytes.compare_exchange_weak(seen, now, std::memory_order_relaxed)) {
  }
}

// Reserves `bytes` against the cap; throws OutOfMemory without counting anything when over.
void reserve_bytes(int64_t bytes) {
  int64_t seen = g_current_bytes.load(std::memory_order_relaxed);
  int64_t now = 0;
  do {
    now = seen + bytes;
    const int64_t cap = g_cap_bytes.load(std::memory_order_relaxed);
    if (cap > 0 && now > cap) {
      throw OutOfMemory("out of memory: tried to allocate " + format_mib(bytes) + " with " + format_mib(seen) +
                            " in use under a CPU memory cap of " + format_mib(cap),
                        bytes);
    }
  } while (!g_current_bytes.compare_exchange_weak(seen, now, std::memory_order_relaxed));
  raise_peak(now);
}

// The wrapped allocator's DataPtr (whose destruction frees the memory) and the size to count down.
// They live in a table keyed by the data pointer, not in the DataPtr context: oneDNN goes through
// raw_allocate()/raw_deallocate(), which require context == data.
struct CountedBlock {
  c10::DataPtr original;
  int64_t bytes = 0;
};

// Sharded by address so that threads of one parallel op rarely wait on the same mutex.
class BlockTable {
 public:
  // A stale entry at the same address (freed behind our back after an uninstall) is dropped uncounted.
  void insert(void* data, CountedBlock block) {
    Shard& shard = shard_of(data);
    CountedBlock stale;
    {
      std::lock_guard<std::mutex> lock(shard.mutex);
      auto [it, inserted] = shard.blocks.try_emplace(data);
      if (!inserted) {
        stale = std::move(it->second);
      }
      it->second = std::move(block);
    }
    if (stale.bytes > 0) {
      g_current_bytes.fetch_sub(stale.bytes, std::memory_order_relaxed);
      stale.original.release_context();  // already freed by someone else; must not free again
    }
  }

  // Moves the block out; false when the address was not allocated through the counter.
  bool take(void* data, CountedBlock& out) {
    Shard& shard = shard_of(data);
    std::lock_guard<std::mutex> lock(shard.mutex);
    auto it = shard.blocks.find(data);
    if (it == shard.blocks.end()) {
      return false;
    }
    out = std::move(it->second);
    shard.blocks.erase(it);
    return true;
  }

 private:
  struct Shard {
    std::mutex mutex;
    std::unordered_map<void*, CountedBlock> blocks;
  };
  static constexpr size_t kShards = 32;

  Shard& shard_of(void* data) {
    // Allocations are at least 64-byte aligned, so the low bits carry no information.
    return shards_[(reinterpret_cast<uintptr_t>(data) >> 6) % kShards];
  }

  std::array<Shard, kShards> shards_;
};

// Never destroyed: blocks may be freed during static destruction.
BlockTable& block_table() {
  static auto* table = new BlockTable();
  return *table;
}

c10::Allocator* g_base_allocator = nullptr;

void free_counted(void* data) {
  CountedBlock block;
  if (block_table().take(data, block)) {
    g_current_bytes.fetch_sub(block.bytes, std::memory_order_relaxed);
    return;  // `block.original` frees the memory here
  }
  // Raw-allocated by the previous allocator before installation: hand it back to that one.
  if (g_base_allocator != nullptr && g_base_allocator->raw_deleter() != nullptr) {
    g_base_allocator->raw_deleter()(data);
  }
}

// No `override` on purpose: LibTorch 1.x declares allocate() const, 2.x non-const and adds
// copy_data(); declaring both forms overrides whichever the installed version has.
class CountingCpuAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) const { return allocate_counted(n); }  // NOLINT(modernize-use-override): above
  c10::DataPtr allocate(size_t n) { return allocate_counted(n); }        // NOLINT(modernize-use-override): above
  c10::DeleterFnPtr raw_deleter() const { return &free_counted; }
  void copy_data(void* dest, const void* src, std::size_t count) const {
    std::copy_n(static_cast<const char*>(src), count, static_cast<char*>(dest));
  }

 private:
  c10::DataPtr allocate_counted(size_t n) const {
    if (n == 0) {
      return g_base_allocator->allocate(0);
    }
    const auto bytes = static_cast<int64_t>(n);
    reserve_bytes(bytes);
    CountedBlock block;
    void* data = nullptr;
    try {
      block.original = g_base_allocator->allocate(n);
      block.bytes = bytes;
      data = block.original.get();
      block_table().insert(data, std::move(block));
    } catch (...) {
      g_current_bytes.fetch_sub(bytes, std::memory_order_relaxed);
      throw;
    }
    return c10::DataPtr(data, data, &free_counted, c10::Device(c10::kCPU));
  }
};

// Above the default allocator's registration priority (0) so the swap takes effect.
constexpr uint8_t kCounterPriority = 100;

std::mutex g_install_mutex;

// Never destroyed: blocks it handed out may outlive any static destructor order.
CountingCpuAllocator& counter() {
  static auto* instance = new CountingCpuAllocator();
  return *instance;
}

std::string lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return text;
}

}  // namespace

OutOfMemory::OutOfMemory(const std::string& message, int64_t requested_bytes)
    : std::runtime_error(lower(message).find("out of memory") == std::string::npos ? "out of memory: " + message
                                                                                   : message),
      requested_bytes_(requested_bytes) {}

bool is_out_of_memory(const std::exception& error) {
  if (dynamic_cast<const OutOfMemory*>(&error) != nullptr ||
      dynamic_cast<const c10::OutOfMemoryError*>(&error) != nullptr) {
    return true;
  }
  // Near the cap the libraries fail before the caching allocator does, each in its own words: cuBLAS when it
  // cannot allocate its handle or workspace, cuDNN when no convolution engine fits the workspace it can get.
  const std::string what = lower(error.what());
  for (const char* sign : {"out of memory", "cublas_status_alloc_failed", "cudnn_status_alloc_failed",
                           "unable to find an engine", "cudnn_status_not_enough_workspace"}) {
    if (what.find(sign) != std::string::npos) return true;
  }
  return false;
}

bool is_out_of_memory(const std::exception_ptr& error) {
  if (!error) {
    return false;
  }
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return is_out_of_memory(e);
  } catch (...) {
    return false;
  }
}

void install_cpu_memory_counter() {
  std::lock_guard<std::mutex> lock(g_install_mutex);
  CountingCpuAllocator& instance = counter();
  c10::Allocator* current = c10::GetCPUAllocator();
  if (current == &instance) {
    return;
  }
  g_base_allocator = current;
  c10::SetCPUAllocator(&instance, kCounterPriority);
  if (c10::GetCPUAllocator() != &instance) {
    throw std::runtime_error(
        "cannot install the CPU memory counter: another CPU allocator was registered with a higher "
        "priority");
  }
}

void uninstall_cpu_memory_counter() {
  std::lock_guard<std::mutex> lock(g_install_mutex);
  CountingCpuAllocator& instance = counter();
  if (c10::GetCPUAllocator() != &instance || g_base_allocator == nullptr) {
    return;
  }
  c10::SetCPUAllocator(g_base_allocator, kCounterPriority);
}

bool cpu_memory_counter_installed() { return c10::GetCPUAllocator() == &counter(); }

void set_cpu_memory_cap(int64_t bytes) {
  if (bytes < 0) {
    throw std::invalid_argument("CPU memory cap must be >= 0 bytes (0 = no cap), got " + std::to_string(bytes));
  }
  g_cap_bytes.store(bytes);
}

int64_t cpu_memory_cap() { return g_cap_bytes.load(); }

MemoryMeter::MemoryMeter(c10::Device device) : device_(device) {
  if (device_.is_cpu()) {
    install_cpu_memory_counter();
    return;
  }
  if (!device_.is_cuda()) {
    throw std::invalid_argument("memory meter: unsupported device " + device_.str());
  }
#ifndef YOLO8_WITH_CUDA
  throw std::runtime_error("memory meter: device " + device_.str() +
                           " needs a CUDA build of yolo8 (this one is CPU only)");
#endif
}

#ifdef YOLO8_WITH_CUDA
namespace {
// Index 0 of each StatArray is the aggregate over pools in LibTorch 1.13 and 2.x alike; indexing
// avoids naming StatType, which moved namespaces in 2.x.
constexpr size_t kAggregateStat = 0;

// LibTorch's CUDA allocator exists only once CUDA is initialised: Python's torch.cuda calls initialise it first, the
// C++ API does not, and setMemoryFraction, getDeviceStats or resetPeakStats before the first CUDA tensor throw
// "Allocator not initialized". Every use of the allocator here goes through this (idempotent) initialisation.
c10::DeviceIndex initialised_cuda(int device) {
  at::globalContext().lazyInitDevice(c10::DeviceType::CUDA);
  return static_cast<c10::DeviceIndex>(device);
}

c10::DeviceIndex cuda_index(const c10::Device& device) {
  return initialised_cuda(device.has_index() ? device.index() : 0);
}
}  // namespace
#endif

void MemoryMeter::reset_peak() {
  if (device_.is_cpu()) {
    g_peak_bytes.store(g_current_bytes.load());
    return;
  }
#ifdef YOLO8_WITH_CUDA
  c10::cuda::CUDACachingAllocator::resetPeakStats(cuda_index(device_));
#endif
}

MemoryStats MemoryMeter::stats() const {
  MemoryStats result;
  if (device_.is_cpu()) {
    result.current_bytes = g_current_bytes.load();
    result.peak_bytes = std::max(g_peak_bytes.load(), result.current_bytes);
    result.reserved_bytes = result.current_bytes;
    result.reserved_peak_bytes = result.peak_bytes;
    return result;
  }
#ifdef YOLO8_WITH_CUDA
  const auto device_stats = c10::cuda::CUDACachingAllocator::getDeviceStats(cuda_index(device_));
  result.current_bytes = device_stats.allocated_bytes[kAggregateStat].current;
  result.peak_bytes = device_stats.allocated_bytes[kAggregateStat].peak;
  result.reserved_bytes = device_stats.reserved_bytes[kAggregateStat].current;
  result.reserved_peak_bytes = device_stats.reserved_bytes[kAggregateStat].peak;
#endif
  return result;
}

int64_t MemoryMeter::current_bytes() const { return stats().current_bytes; }
int64_t MemoryMeter::peak_bytes() const { return stats().peak_bytes; }
int64_t MemoryMeter::reserved_bytes() const { return stats().reserved_bytes; }
int64_t MemoryMeter::reserved_peak_bytes() const { return stats().reserved_peak_bytes; }

void cap_process_memory(double fraction, int device) {
  if (!(fraction > 0.0 && fraction <= 1.0)) {
    throw std::invalid_argument("memory fraction must be in (0, 1], got " + std::to_string(fraction));
  }
#ifdef YOLO8_WITH_CUDA
  c10::cuda::CUDACachingAllocator::setMemoryFraction(fraction, initialised_cuda(device));
#else
  throw std::runtime_error("cap_process_memory(cuda:" + std::to_string(device) + "): this yolo8 build has no CUDA");
#endif
}

int64_t cuda_device_total_bytes(int device) {
#ifdef YOLO8_WITH_CUDA
  return static_cast<int64_t>(at::cuda::getDeviceProperties(static_cast<c10::DeviceIndex>(device))->totalGlobalMem);
#else
  throw std::runtime_error("cuda_device_total_bytes(cuda:" + std::to_string(device) +
                           "): this yolo8 build has no CUDA");
#endif
}

void cap_memory_bytes(int64_t bytes, const c10::Device& device) {
  if (bytes <= 0) {
    throw std::invalid_argument("memory cap must be > 0 bytes, got " + std::to_string(bytes));
  }
  if (device.is_cpu()) {
    install_cpu_memory_counter();
    set_cpu_memory_cap(bytes);
    return;
  }
  const int index = device.has_index() ? device.index() : 0;
  const double total = static_cast<double>(cuda_device_total_bytes(index));
  cap_process_memory(std::min(static_cast<double>(bytes) / total, 1.0), index);
}

int64_t default_memory_budget_bytes(const c10::Device& device) {
  if (device.is_cuda()) {
    return cuda_device_total_bytes(device.has_index() ? device.index() : 0);
  }
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page_size <= 0) {
    throw std::runtime_error("cannot read the machine's physical memory size");
  }
  return static_cast<int64_t>(pages) * page_size;
}

void release_cached_memory(const c10::Device& device) {
#ifdef YOLO8_WITH_CUDA
  if (device.is_cuda()) {
    cuda_index(device);
    c10::cuda::CUDACachingAllocator::emptyCache();
  }
#else
  (void)device;
#endif
}

}  // namespace yolo8
