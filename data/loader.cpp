#include "data/loader.h"

#include <malloc.h>

#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <numeric>
#include <stdexcept>

#include "data/image_io.h"
#include "data/pixel_kernels.h"

namespace yolo8::data {
namespace fs = std::filesystem;

namespace {

constexpr char kImgMagic[4] = {'Y', '8', 'I', 'M'};

std::string disk_cache_path(const std::string& image, int imgsz, bool augment) {
  return image + ".s" + std::to_string(imgsz) + (augment ? "l" : "a") + ".y8img";
}

bool read_disk_cache(const std::string& path, cv::Mat& img, int& h0, int& w0) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  char magic[4];
  int32_t hdr[4];
  in.read(magic, 4);
  in.read(reinterpret_cast<char*>(hdr), sizeof hdr);
  if (!in || std::memcmp(magic, kImgMagic, 4) != 0 || hdr[0] <= 0 || hdr[1] <= 0 || hdr[0] > 65536 || hdr[1] > 65536)
    return false;
  cv::Mat m(hdr[0], hdr[1], CV_8UC3);
  in.read(reinterpret_cast<char*>(m.data), static_cast<std::streamsize>(m.total() * m.elemSize()));
  if (!in) return false;
  img = m;
  h0 = hdr[2];
  w0 = hdr[3];
  return true;
}

void write_disk_cache(const std::string& path, const cv::Mat& img, int h0, int w0) {
  const std::string tmp = path + ".tmp" + std::to_string(std::hash<std::thread::id>{}(std::this_thread::get_id()));
  {
    std::ofstream o(tmp, std::ios::binary);
    if (!o) return;  // read-only folder: run without the disk cache
    int32_t hdr[4] = {img.rows, img.cols, h0, w0};
    o.write(kImgMagic, 4);
    o.write(reinterpret_cast<const char*>(hdr), sizeof hdr);
    cv::Mat c = img.isContinuous() ? img : img.clone();
    o.write(reinterpret_cast<const char*>(c.data), static_cast<std::streamsize>(c.total() * c.elemSize()));
    if (!o) {
      std::error_code ec;
      fs::remove(tmp, ec);
      return;
    }
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) fs::remove(tmp, ec);
}

// MemAvailable from /proc/meminfo in bytes, or -1 when unknown.
double available_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  double kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024.0;
  return -1;
}

bool is_jpeg(const std::string& path) {
  auto dot = path.find_last_of('.');
  if (dot == std::string::npos) return false;
  std::string e = path.substr(dot + 1);
  for (auto& c : e) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return e == "jpg" || e == "jpeg";
}

std::vector<PixBox> to_pixels(const std::vector<BoxLabel>& labels, int w, int h, bool single_cls) {
  std::vector<PixBox> out;
  out.reserve(labels.size());
  for (const auto& l : labels) {
    out.push_back({single_cls ? 0.f : l.cls, (l.cx - l.w / 2) * w, (l.cy - l.h / 2) * h, (l.cx + l.w / 2) * w,
                   (l.cy + l.h / 2) * h});
  }
  return out;
}

// Applies a letterbox's scale and offset to boxes: the reference's label offset, not the image's (LetterboxInfo).
void letterbox_boxes(std::vector<PixBox>& boxes, const LetterboxInfo& lb, int w, int h) {
  const float sx = static_cast<float>(lb.new_w) / w, sy = static_cast<float>(lb.new_h) / h;
  const auto dx = static_cast<float>(lb.label_pad_w), dy = static_cast<float>(lb.label_pad_h);
  for (auto& b : boxes) {
    b.x1 = b.x1 * sx + dx;
    b.x2 = b.x2 * sx + dx;
    b.y1 = b.y1 * sy + dy;
    b.y2 = b.y2 * sy + dy;
  }
}

// BGR HWC -> RGB planes of the batch tensor, in one pass.
void copy_to_planes(const cv::Mat& img, uint8_t* dst) {
  const size_t plane = static_cast<size_t>(img.rows) * img.cols;
  if (img.type() == CV_8UC3 && avx512_vbmi_supported()) {
    for (int r = 0; r < img.rows; ++r) {
      const size_t at = static_cast<size_t>(r) * img.cols;
      split_rgb_avx512(img.ptr<uint8_t>(r), img.cols, dst + at, dst + plane + at, dst + 2 * plane + at);
    }
    return;
  }
  cv::Mat planes[3] = {cv::Mat(img.rows, img.cols, CV_8UC1, dst + 2 * plane),
                       cv::Mat(img.rows, img.cols, CV_8UC1, dst + plane), cv::Mat(img.rows, img.cols, CV_8UC1, dst)};
  cv::split(img, planes);
}

}  // namespace

DataLoader::DataLoader(const std::shared_ptr<const DatasetIndex>& index, LoaderConfig cfg, AugmentConfig aug,
                       bool train)
    : cfg_(cfg), aug_(aug), train_(train) {
  if (!index) throw std::invalid_argument("DataLoader: no dataset index");
  keep_large_buffers_in_heap();
  validate(cfg_);
  validate(aug_);
  records_ = index->records;
  if (train_ && cfg_.fraction < 1.0)
    records_.resize(static_cast<size_t>(std::llround(static_cast<double>(records_.size()) * cfg_.fraction)));
  if (records_.empty()) throw std::runtime_error("DataLoader: the dataset has no usable images");
  rect_ = cfg_.rect;
  if (rect_) {
    std::vector<std::pair<int, int>> hw;
    for (const auto& r : records_) hw.emplace_back(r.height, r.width);
    rect_order_ = aspect_order(hw);
    std::vector<std::pair<int, int>> sorted;
    for (size_t i : rect_order_) sorted.push_back(hw[i]);
    batch_shapes_ = rect_batch_shapes(sorted, cfg_.batch, cfg_.imgsz, cfg_.stride, train_ ? 0.0 : 0.5);
  }
  if (cfg_.cache == CacheMode::kRam) {
    // Like the reference: fall back to no cache when the resized images would not fit in half the free RAM.
    double need = 0;
    for (const auto& r : records_) {
      const double g = static_cast<double>(cfg_.imgsz) / std::max(1, std::max(r.width, r.height));
      need += 3.0 * std::ceil(r.width * g) * std::ceil(r.height * g);
    }
    const double avail = available_memory_bytes();
    if (avail > 0 && need * 1.5 > avail) {
      cache_note_ = "cache=ram needs " + std::to_string(static_cast<int64_t>(need / (1 << 20))) + " MiB (+50%), " +
                    std::to_string(static_cast<int64_t>(avail / (1 << 20))) + " MiB available: not caching";
      cfg_.cache = CacheMode::kNone;
    }
  }
  if (cfg_.cache == CacheMode::kRam) {
    held_capacity_ = records_.size();
  } else if (train_) {
    held_capacity_ = std::min(
        {records_.size(), static_cast<size_t>(8) * static_cast<size_t>(cfg_.batch), static_cast<size_t>(1000)});
  }
  if (held_capacity_ > 0) held_.resize(records_.size());
  const int hw_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  workers_ = std::min(cfg_.workers, hw_threads);
}

DataLoader::~DataLoader() { stop_workers(); }

int64_t DataLoader::num_batches() const { return (shard_size() + cfg_.batch - 1) / cfg_.batch; }

int64_t DataLoader::shard_size() const {
  const int64_t total = static_cast<int64_t>(records_.size());
  const bool sharded = train_ && cfg_.world_size > 1;
  return sharded ? (total + cfg_.world_size - 1) / cfg_.world_size : total;
}

bool DataLoader::update_close_mosaic(int64_t epoch, int64_t epochs) {
  closed_ = epoch >= epochs - aug_.close_mosaic;
  return mosaic();
}

std::vector<size_t> shard_order(const std::vector<size_t>& global_order, int rank, int world_size) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    throw std::invalid_argument("shard_order: rank " + std::to_string(rank) + " of world size " +
                                std::to_string(world_size));
  }
  const size_t world = static_cast<size_t>(world_size);
  const size_t n = global_order.size();
  if (n == 0) return {};
  const size_t per_rank = (n + world - 1) / world;
  std::vector<size_t> shard;
  shard.reserve(per_rank);
  for (size_t k = 0; k < per_rank; ++k) shard.push_back(global_order[(static_cast<size_t>(rank) + k * world) % n]);
  return shard;
}

std::vector<size_t> DataLoader::epoch_order(int64_t epoch) const {
  if (rect_) return rect_order_;
  std::vector<size_t> order(records_.size());
  std::iota(order.begin(), order.end(), size_t{0});
  if (train_ && cfg_.shuffle) {
    Rng rng(Rng::mix(cfg_.seed, static_cast<uint64_t>(epoch), ~uint64_t{0}));
    for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[static_cast<size_t>(rng.randint(i))]);
  }
  if (train_ && cfg_.world_size > 1) return shard_order(order, cfg_.rank, cfg_.world_size);
  return order;
}

DataLoader::Loaded DataLoader::load_image(size_t i) const {
  const bool augment = train_;
  if (held_capacity_ > 0) {
    std::lock_guard<std::mutex> lock(cache_mu_);
    if (!held_[i].img.empty()) return held_[i];
  }
  const auto& rec = records_[i];
  Loaded out;
  std::string disk;
  if (cfg_.cache == CacheMode::kDisk) {
    disk = disk_cache_path(rec.image, cfg_.imgsz, augment);
    if (read_disk_cache(disk, out.img, out.h0, out.w0)) return out;
  }
  // JPEG scales by 1/2, 1/4, 1/8 inside the DCT: decoding a large photo straight to >= imgsz is several times faster.
  // Only for training, whose augmentation dwarfs the difference: validation decodes the full image, as the
  // reference does, so that its pixels and metrics match (tests/trainer/support/val_golden_test.cpp).
  int reduce = 1;
  const int long0 = std::max(rec.width, rec.height);
  if (augment && is_jpeg(rec.image)) {
    if (long0 >= 8 * cfg_.imgsz)
      reduce = 8;
    else if (long0 >= 4 * cfg_.imgsz)
      reduce = 4;
    else if (long0 >= 2 * cfg_.imgsz)
      reduce = 2;
  }
  cv::Mat img = read_image(rec.image, reduce);
  if (img.empty()) throw std::runtime_error(rec.image + ": image does not decode (changed since the check?)");
  out.h0 = reduce == 1 ? img.rows : rec.height;
  out.w0 = reduce == 1 ? img.cols : rec.width;
  out.img = resize_long_side(img, cfg_.imgsz);
  if (!out.img.isContinuous()) out.img = out.img.clone();
  if (cfg_.cache == CacheMode::kDisk) write_disk_cache(disk, out.img, out.h0, out.w0);
  if (held_capacity_ > 0) {
    std::lock_guard<std::mutex> lock(cache_mu_);
    if (held_[i].img.empty()) {  // another worker may have decoded it meanwhile
      held_[i] = out;
      held_order_.push_back(i);
      if (held_order_.size() > held_capacity_) {
        held_[held_order_.front()] = Loaded{};
        held_order_.pop_front();
      }
    }
  }
  return out;
}

Batch DataLoader::load_batch(int64_t epoch, int64_t batch_index) const {
  return build_batch(epoch, batch_index, epoch_order(epoch), closed_);
}

Batch DataLoader::build_batch(int64_t epoch, int64_t b, const std::vector<size_t>& order, bool closed) const {
  const size_t start = static_cast<size_t>(b) * static_cast<size_t>(cfg_.batch);
  const size_t end = std::min(order.size(), start + static_cast<size_t>(cfg_.batch));
  if (b < 0 || start >= end) throw std::out_of_range("DataLoader: batch index " + std::to_string(b) + " out of range");
  const size_t n = end - start;
  const int s = cfg_.imgsz;
  int out_h = s, out_w = s;
  if (rect_) std::tie(out_h, out_w) = batch_shapes_[static_cast<size_t>(b)];

  std::vector<Loaded> loaded(n);
  std::vector<std::vector<PixBox>> boxes(n);
  for (size_t k = 0; k < n; ++k) {
    loaded[k] = load_image(order[start + k]);
    boxes[k] = to_pixels(records_[order[start + k]].boxes, loaded[k].img.cols, loaded[k].img.rows, cfg_.single_cls);
  }

  Batch batch;
  batch.epoch = epoch;
  batch.index = b;
  auto u8 = torch::TensorOptions().dtype(torch::kUInt8);
#ifdef YOLO8_WITH_CUDA
  if (cfg_.pin_memory) u8 = u8.pinned_memory(true);
#endif
  batch.images = torch::empty({static_cast<int64_t>(n), 3, out_h, out_w}, u8);
  batch.ratio_pad = torch::zeros({static_cast<int64_t>(n), 4}, torch::kFloat64);
  auto rp = batch.ratio_pad.accessor<double, 2>();
  std::vector<float> labels;

  cv::Mat canvas, work, other;
  std::vector<PixBox> bx, other_bx;
  // Mosaic partners come from the same batch: its images are decoded once and each is a centre once.
  auto make_train = [&](size_t k, Rng& rng, cv::Mat& out, std::vector<PixBox>& ob, bool lr, bool ud) {
    if (!closed && rng.chance(aug_.mosaic)) {
      Tile tiles[4];
      tiles[0] = {&loaded[k].img, &boxes[k]};
      for (int t = 1; t < 4; ++t) {
        size_t j = static_cast<size_t>(rng.randint(static_cast<int64_t>(n)));
        tiles[t] = {&loaded[j].img, &boxes[j]};
      }
      mosaic_perspective(tiles, s, aug_, rng, canvas, out, ob, lr, ud);
    } else {
      LetterboxInfo lb;
      cv::Mat lbimg = letterbox(loaded[k].img, s, s, true, &lb);
      ob = boxes[k];
      letterbox_boxes(ob, lb, loaded[k].img.cols, loaded[k].img.rows);
      random_perspective(lbimg, ob, aug_, 0, rng, out, lr, ud);
    }
  };

  for (size_t k = 0; k < n; ++k) {
    const size_t rec = order[start + k];
    Rng rng(Rng::mix(cfg_.seed, static_cast<uint64_t>(epoch), rec));
    const Loaded& L = loaded[k];
    double gain_h = static_cast<double>(L.img.rows) / L.h0, gain_w = static_cast<double>(L.img.cols) / L.w0;
    double pad_w = 0, pad_h = 0;
    if (letterbox_only()) {
      LetterboxInfo lb;
      work = letterbox(L.img, out_h, out_w, false, &lb);
      bx = boxes[k];
      letterbox_boxes(bx, lb, L.img.cols, L.img.rows);
      gain_h *= static_cast<double>(lb.new_h) / L.img.rows;
      gain_w *= static_cast<double>(lb.new_w) / L.img.cols;
      pad_w = lb.left;
      pad_h = lb.top;
    } else {
      // Flips are drawn first and folded into the warps (of both mixup images: the blend is flipped as one).
      const bool ud = rng.chance(aug_.flipud), lr = rng.chance(aug_.fliplr);
      make_train(k, rng, work, bx, lr, ud);
      if (!closed && rng.chance(aug_.mixup)) {
        make_train(static_cast<size_t>(rng.randint(static_cast<int64_t>(n))), rng, other, other_bx, lr, ud);
        mixup(work, bx, other, other_bx, rng);
      }
    }
    if (train_) augment_hsv(work, aug_.hsv_h, aug_.hsv_s, aug_.hsv_v, rng);
    if (train_ && rect_) {
      if (rng.chance(aug_.flipud)) flip_ud(work, bx);
      if (rng.chance(aug_.fliplr)) flip_lr(work, bx);
    }
    copy_to_planes(work, batch.images[static_cast<int64_t>(k)].data_ptr<uint8_t>());
    const float img_w = static_cast<float>(work.cols), img_h = static_cast<float>(work.rows);
    for (const auto& p : bx) {
      const float w = p.x2 - p.x1, h = p.y2 - p.y1;
      if (w <= 0 || h <= 0) continue;
      labels.insert(labels.end(), {static_cast<float>(k), p.cls, (p.x1 + w / 2) / img_w, (p.y1 + h / 2) / img_h,
                                   w / img_w, h / img_h});
    }
    rp[static_cast<int64_t>(k)][0] = gain_h;
    rp[static_cast<int64_t>(k)][1] = gain_w;
    rp[static_cast<int64_t>(k)][2] = pad_w;
    rp[static_cast<int64_t>(k)][3] = pad_h;
    batch.orig_shapes.emplace_back(L.h0, L.w0);
    batch.paths.push_back(records_[rec].image);
  }
  const int64_t nl = static_cast<int64_t>(labels.size() / 6);
  batch.labels = nl ? torch::from_blob(labels.data(), {nl, 6}, torch::kFloat32).clone() : torch::zeros({0, 6});
  return batch;
}

// ---------------------------------------------------------------------------------------------------- threads

void DataLoader::stop_workers() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
  threads_.clear();
  std::lock_guard<std::mutex> lock(mu_);
  stop_ = false;
  ready_.clear();
}

void DataLoader::start_epoch(int64_t epoch, int64_t first_batch) {
  stop_workers();
  if (first_batch < 0 || first_batch > num_batches())
    throw std::out_of_range("DataLoader: start batch " + std::to_string(first_batch) + " outside the epoch");
  {
    std::lock_guard<std::mutex> lock(mu_);
    epoch_ = epoch;
    produce_next_ = consume_next_ = first_batch;
    closed_epoch_ = closed_;
    order_ = epoch_order(epoch);
  }
  for (int t = 0; t < workers_; ++t) threads_.emplace_back([this] { worker_loop(); });
}

void DataLoader::worker_loop() {
  const int64_t nb = num_batches();
  for (;;) {
    int64_t b;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || (produce_next_ < nb && produce_next_ < consume_next_ + cfg_.prefetch); });
      if (stop_) return;
      b = produce_next_++;
    }
    Slot slot;
    try {
      slot.batch = build_batch(epoch_, b, order_, closed_epoch_);
    } catch (...) {
      slot.error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      ready_[b] = std::move(slot);
    }
    cv_.notify_all();
  }
}

std::optional<Batch> DataLoader::next(const std::function<bool()>& give_up) {
  int64_t b;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (order_.empty()) throw std::logic_error("DataLoader: call start_epoch before next");
    if (consume_next_ >= num_batches()) return std::nullopt;
    b = consume_next_;
  }
  if (threads_.empty()) {
    Batch out = build_batch(epoch_, b, order_, closed_epoch_);
    std::lock_guard<std::mutex> lock(mu_);
    ++consume_next_;
    return out;
  }
  Slot slot;
  {
    std::unique_lock<std::mutex> lock(mu_);
    const auto ready = [&] { return ready_.count(b) > 0; };
    if (!give_up) {
      cv_.wait(lock, ready);
    } else {
      while (!cv_.wait_for(lock, std::chrono::milliseconds(100), ready)) {
        if (give_up()) throw WaitAbandoned(b);
      }
    }
    slot = std::move(ready_[b]);
    ready_.erase(b);
    ++consume_next_;
  }
  cv_.notify_all();
  if (slot.error) std::rethrow_exception(slot.error);
  return std::move(slot.batch);
}

std::pair<int64_t, int64_t> DataLoader::position() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {epoch_, consume_next_};
}

// Decoded images, canvases and batch tensors are a few MB each and live for one batch. By default glibc hands such
// blocks back to the kernel when freed and page-faults them in again for the next batch, which cost 8 % of the
// loader's time at imgsz 640; kept in the heap, their pages are reused.
void keep_large_buffers_in_heap() {
#ifdef __GLIBC__
  static std::once_flag once;
  std::call_once(once, [] {
    mallopt(M_MMAP_THRESHOLD, 32 << 20);   // glibc's maximum
    mallopt(M_TRIM_THRESHOLD, 256 << 20);  // what the heap may keep unused before returning it
    // Above the threshold glibc still maps every block afresh and the kernel zero-fills its pages at each step:
    // at 640 px (activations and the loss's batch x labels x anchors buffers over 32 MiB) that was a quarter of
    // the step's CPU time. From the heap they are reused; the peak resident memory measured the same.
    mallopt(M_MMAP_MAX, 0);
  });
#endif
}

}  // namespace yolo8::data
