#pragma once
// Multi-threaded batch loader: deterministic batches for (seed, epoch) whatever the thread timing.
#include <opencv2/core.hpp>
#include <torch/torch.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "data/augment.h"
#include "data/config.h"
#include "data/dataset.h"

namespace yolo8::data {

struct Batch {
  torch::Tensor images;     // B x 3 x H x W uint8, RGB, contiguous (pinned when the config says pin_memory)
  torch::Tensor labels;     // N x 6 float32: image index in batch, class, cx, cy, w, h (normalised to H, W)
  torch::Tensor ratio_pad;  // B x 4 float64: gain_h, gain_w, pad_w, pad_h (original pixels -> batch pixels)
  std::vector<std::pair<int, int>> orig_shapes;  // (h, w) of the files
  std::vector<std::string> paths;
  int64_t epoch = 0;
  int64_t index = 0;  // batch index within the epoch
};

// next(give_up) stopped waiting for a batch that did not come: a worker may be stuck in a read that never returns
// (an image on a hung network filesystem), so the loader cannot be joined and only leaving the process ends it.
class WaitAbandoned : public std::runtime_error {
 public:
  explicit WaitAbandoned(int64_t batch)
      : std::runtime_error("gave up waiting for batch " + std::to_string(batch) + " of the data loader") {}
};

class DataLoader {
 public:
  // train = augmentation (mosaic etc.) and shuffling; otherwise letterboxed batches in file order (validation),
  // or in aspect-ratio order with the smallest shape per batch when cfg.rect (as the reference validates).
  DataLoader(const std::shared_ptr<const DatasetIndex>& index, LoaderConfig cfg, AugmentConfig aug, bool train);
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  int64_t size() const { return static_cast<int64_t>(records_.size()); }
  int64_t num_batches() const;
  int64_t shard_size() const;  // images this process sees per epoch (all of them unless data-parallel)
  int workers() const { return workers_; }
  CacheMode cache() const { return cfg_.cache; }                 // kNone when cache=ram did not fit in memory
  const std::string& cache_note() const { return cache_note_; }  // why a requested cache was dropped, else ""

  // Mosaic and mixup off for the last close_mosaic epochs, as the reference does; call before start_epoch.
  // Returns whether mosaic is on.
  bool update_close_mosaic(int64_t epoch, int64_t epochs);
  void set_mosaic(bool on) { closed_ = !on; }  // false = closed: neither mosaic nor mixup
  bool mosaic() const { return train_ && !rect_ && aug_.mosaic > 0 && !closed_; }

  // Starts producing epoch `epoch` from batch `first_batch` (resuming mid-epoch continues there).
  void start_epoch(int64_t epoch, int64_t first_batch = 0);
  // Next batch of the current epoch, or nullopt at its end. Rethrows loading errors with the file name. While the
  // workers have not delivered it, `give_up` (when set) is asked every 100 ms; when it says so, throws WaitAbandoned.
  std::optional<Batch> next(const std::function<bool()>& give_up = {});
  // (epoch, next batch index) to store in a checkpoint.
  std::pair<int64_t, int64_t> position() const;

  // One batch built on the calling thread; identical to what the workers produce.
  Batch load_batch(int64_t epoch, int64_t batch_index) const;

 private:
  struct Loaded {
    cv::Mat img;         // resized so the long side is imgsz
    int h0 = 0, w0 = 0;  // original size
  };
  Loaded load_image(size_t record) const;
  std::vector<size_t> epoch_order(int64_t epoch) const;
  void stop_workers();
  void worker_loop();
  // No augmentation: validation, or rectangular training.
  bool letterbox_only() const { return !train_ || rect_; }

  std::vector<ImageRecord> records_;
  LoaderConfig cfg_;
  AugmentConfig aug_;
  bool train_;
  bool rect_;  // rectangular batch shapes, images in aspect-ratio order
  int workers_ = 0;
  std::string cache_note_;
  bool closed_ = false;
  std::vector<size_t> rect_order_;
  std::vector<std::pair<int, int>> batch_shapes_;

  // Decoded images held in memory: all of them with cache=ram; otherwise, for training, the last min(images,
  // 8 x batch, 1000) decoded, as the reference's loader does, so that on a set of a few hundred images most of an
  // epoch needs no decode. 0: none held (validation without cache=ram).
  mutable std::mutex cache_mu_;
  size_t held_capacity_ = 0;
  mutable std::vector<Loaded> held_;       // by record; an empty img when not held
  mutable std::deque<size_t> held_order_;  // records held, oldest first

  // Epoch state shared with the workers.
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::thread> threads_;
  bool stop_ = false;
  int64_t epoch_ = 0;
  int64_t produce_next_ = 0;
  int64_t consume_next_ = 0;
  bool closed_epoch_ = false;
  std::vector<size_t> order_;
  struct Slot {
    std::optional<Batch> batch;
    std::exception_ptr error;
  };
  std::map<int64_t, Slot> ready_;

  Batch build_batch(int64_t epoch, int64_t b, const std::vector<size_t>& order, bool closed) const;
};

// This rank's share of an epoch's sample order, which must be the same on every rank (same seed): the order
// is padded by wrapping around to a multiple of world_size and rank r takes positions r, r+W, r+2W, ...
// Every rank gets ceil(n/W) samples, hence the same number of batches and of collective calls.
std::vector<size_t> shard_order(const std::vector<size_t>& global_order, int rank, int world_size);

// Keeps multi-megabyte buffers (decoded images, batch tensors, activations) in the heap instead of fresh kernel
// mappings that are page-faulted in again for every batch (glibc; process-wide, idempotent). The loader calls it;
// programs that train without one (benchmarks of the bare step) call it to measure the same allocator.
void keep_large_buffers_in_heap();

}  // namespace yolo8::data
