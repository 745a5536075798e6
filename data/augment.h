#pragma once
// Image transforms of the pipeline on BGR uint8 cv::Mat with boxes in pixels.
#include <opencv2/core.hpp>

#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "data/config.h"

namespace yolo8::data {

// Deterministic stream; one per sample, seeded from (seed, epoch, index) so thread timing never matters.
class Rng {
 public:
  explicit Rng(uint64_t seed) : gen_(seed) {}
  static uint64_t mix(uint64_t seed, uint64_t epoch, uint64_t index);
  double uniform(double a = 0.0, double b = 1.0);
  int64_t randint(int64_t n);  // in [0, n)
  bool chance(double p) { return p > 0.0 && uniform() < p; }
  double beta(double a, double b);
  std::mt19937_64& engine() { return gen_; }

 private:
  std::mt19937_64 gen_;
};

// Box in pixels of the current image.
struct PixBox {
  float cls = 0.f;
  float x1 = 0.f, y1 = 0.f, x2 = 0.f, y2 = 0.f;
};

struct LetterboxInfo {
  double ratio = 1.0;        // resize gain of the letterbox itself
  int new_w = 0, new_h = 0;  // resized size before padding
  int left = 0, top = 0;     // padding added on the left / top
  // The unrounded half paddings (dw / 2, dh / 2). Ultralytics 8.0.232's LetterBox moves the labels by these but the
  // image by left/top: with an odd padding its labels sit 0.5 px right of / below the pixels. Boxes follow it,
  // since its metrics and targets are the yardstick (an odd padding moved val_case's mAP50-95 by 8.5e-5).
  double label_pad_w = 0, label_pad_h = 0;
};

// Keep-ratio resize (bilinear) into out_h x out_w, centred, padded with 114; Ultralytics' LetterBox with auto=False.
cv::Mat letterbox(const cv::Mat& img, int out_h, int out_w, bool scaleup = true, LetterboxInfo* info = nullptr,
                  int pad_value = 114);

// Resizes so the long side is imgsz, bilinear whether it shrinks or enlarges: Ultralytics 8.0.232's load_image
// (pixel-exact on tests/fixtures/val_case, where area interpolation is up to 21/255 away).
cv::Mat resize_long_side(const cv::Mat& img, int imgsz);

// Rectangular batch shapes (h, w) for images given as (h, w), already in batch order (sorted by h/w):
// ceil(shape * imgsz / stride + pad) * stride.
std::vector<std::pair<int, int>> rect_batch_shapes(const std::vector<std::pair<int, int>>& hw, int batch, int imgsz,
                                                   int stride, double pad);
// Order of images sorted by aspect ratio h/w (stable).
std::vector<size_t> aspect_order(const std::vector<std::pair<int, int>>& hw);

struct Tile {
  const cv::Mat* img = nullptr;                // resized image, BGR
  const std::vector<PixBox>* boxes = nullptr;  // in pixels of img
};

// Mosaic of four tiles on a 2s x 2s canvas (fill 114) around a random centre; boxes shifted and clipped.
void mosaic4(const Tile tiles[4], int imgsz, Rng& rng, cv::Mat& canvas, std::vector<PixBox>& boxes);

// Random perspective/affine: output (in.rows + 2 border) x (in.cols + 2 border); border = -imgsz/2 after mosaic.
// Boxes are transformed (corners, min/max), clipped and filtered (w, h > 2 px, area ratio > 0.1, aspect < 100).
// flip_lr / flip_ud fold the flips into the same warp (identical to cv::flip afterwards, one pass less).
void random_perspective(const cv::Mat& in, std::vector<PixBox>& boxes, const AugmentConfig& cfg, int border, Rng& rng,
                        cv::Mat& out, bool flip_lr = false, bool flip_ud = false);

// mosaic4 followed by random_perspective (border -imgsz/2) with the same draws and result, building only the part
// of the canvas the affine warp reads (the whole canvas when perspective > 0). `canvas` is scratch space.
void mosaic_perspective(const Tile tiles[4], int imgsz, const AugmentConfig& cfg, Rng& rng, cv::Mat& canvas,
                        cv::Mat& out, std::vector<PixBox>& boxes, bool flip_lr = false, bool flip_ud = false);

// HSV gains through three lookup tables, in place: cv::cvtColor to HSV, the tables, cv::cvtColor back, bit for bit
// (on CPUs with AVX-512 VBMI in one vector pass, data/pixel_kernels.h).
void augment_hsv(cv::Mat& img, double hgain, double sgain, double vgain, Rng& rng);

void flip_lr(cv::Mat& img, std::vector<PixBox>& boxes);
void flip_ud(cv::Mat& img, std::vector<PixBox>& boxes);

// img = r * img + (1 - r) * other, r ~ Beta(32, 32); boxes of both kept.
void mixup(cv::Mat& img, std::vector<PixBox>& boxes, const cv::Mat& other, const std::vector<PixBox>& other_boxes,
           Rng& rng);

// The candidate filter of random_perspective: before (scaled) vs after boxes.
bool box_candidate(const PixBox& before, const PixBox& after, double scale, double wh_thr = 2.0, double ar_thr = 100.0,
                   double area_thr = 0.1);

}  // namespace yolo8::data
