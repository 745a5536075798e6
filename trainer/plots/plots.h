#pragma once
// The run's plots as PNG/JPEG files, drawn with OpenCV (built when OpenCV is found). Every function writes one
// file and throws std::runtime_error naming the file when it cannot read its input or write its output. The output
// format follows the file extension (.png, .jpg).
#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "trainer/detect/metrics.h"

namespace yolo8 {

struct PlotSize {
  int width, height;
};
// Fixed canvas sizes in pixels, so that callers and tests know what to expect.
constexpr PlotSize kResultsPlotSize{2000, 850};
constexpr PlotSize kCurvePlotSize{1500, 900};
constexpr PlotSize kConfusionPlotSize{1400, 1150};
constexpr PlotSize kLabelsPlotSize{1400, 1400};
constexpr PlotSize kCorrelogramPlotSize{2000, 2000};  // Ultralytics': 4 x 2.5 in at 200 dpi
constexpr int kMosaicMaxSide = 1920;
constexpr int kMosaicMaxImages = 16;

struct Rgb {
  uint8_t r, g, b;
};

// The plot palette (20 colours, RGB): class c's colour in every plot and its box colour in mosaics.
Rgb class_color(int64_t cls);

// results.png: 2 x 5 small charts (train/val box, cls, dfl losses; precision, recall, mAP50, mAP50-95) of
// results.csv over its epoch column, the raw curve with markers and a Gaussian-smoothed one (sigma 3).
// Header names may be padded with spaces; other columns are ignored. Throws naming the file (and line) when
// it is missing, lacks one of the ten columns, has no data rows or a field is not a number.
void plot_results_csv(const std::string& csv_path, const std::string& png_path);

// PR_curve.png: precision over recall per class (legend with AP50 when fewer than 21 classes, grey otherwise)
// and the class mean, labelled with mAP50. names: class names by class index (missing -> the index).
void plot_pr_curve(const std::string& png_path, const ApPerClass& stats, const std::vector<std::string>& names);

// F1_curve.png / P_curve.png / R_curve.png: metric over confidence per class plus the smoothed class mean,
// labelled with its maximum and the confidence where it is reached.
void plot_f1_curve(const std::string& png_path, const ApPerClass& stats, const std::vector<std::string>& names);
void plot_p_curve(const std::string& png_path, const ApPerClass& stats, const std::vector<std::string>& names);
void plot_r_curve(const std::string& png_path, const ApPerClass& stats, const std::vector<std::string>& names);

// confusion_matrix(_normalized).png: heat map of a (nc + 1) x (nc + 1) matrix (rows predicted, columns true,
// last = background), numbers in the cells when nc < 30; normalize divides each column by its sum.
// Tick labels are names + "background" when names.size() == nc (< 99), indices otherwise.
void plot_confusion_matrix(const std::string& png_path, const torch::Tensor& matrix,
                           const std::vector<std::string>& names, bool normalize);

// labels.jpg: instances per class, box shapes overlaid at the centre, centre (x, y) density and (w, h)
// density. labels (N, 5) cls, cx, cy, w, h normalised to 0..1.
void plot_labels(const std::string& png_path, const torch::Tensor& labels, const std::vector<std::string>& names);
// labels_correlogram.jpg: the pairs of the boxes' x, y, width, height as Ultralytics' corner pair plot draws them:
// a 4 x 4 grid, histograms (50 bins) on the diagonal, 2-D densities (50 x 50) below it, the upper triangle empty;
// each axis spans its variable's data; labelled x, y, width, height. labels as plot_labels'.
void plot_labels_correlogram(const std::string& png_path, const torch::Tensor& labels);
// Every box of a dataset as plot_labels' (N, 5) float tensor.
torch::Tensor dataset_labels(const data::DatasetIndex& index);

// train_batch0.jpg / val_batch0_labels.png / val_batch0_pred.png: up to 16 images of a batch in a square
// grid with their boxes and class names. images (B, 3, H, W) uint8 RGB; labels (N, 6) image index, cls, cx,
// cy, w, h or (N, 7) with conf last (predictions: only conf > 0.25 drawn, conf printed). Boxes are normalised
// to 0..1 unless any coordinate exceeds 1.1, then they are pixels of the input images. The grid is
// ceil(sqrt(B')) tiles of H x W (B' = min(B, 16)), scaled down so that its longer side is at most 1920.
// paths (optional, by image) are printed at the top of each tile.
void plot_batch_mosaic(const std::string& png_path, const torch::Tensor& images, const torch::Tensor& labels,
                       const std::vector<std::string>& names, const std::vector<std::string>& paths = {});

// Size in pixels (width, height) that plot_batch_mosaic gives a batch of b images of h x w.
PlotSize mosaic_size(int64_t b, int64_t h, int64_t w);

// Per-image detections (n x 6 x1, y1, x2, y2, conf, cls in original-image pixels, as the validator returns
// them) -> (N, 7) image index, cls, cx, cy, w, h normalised to the batch's height x width, conf: the rows
// plot_batch_mosaic draws as predictions. ratio_pad (B, 4) gain_h, gain_w, pad_w, pad_h (data::Batch's)
// maps original pixels to batch pixels; undefined = the detections are already in batch pixels.
torch::Tensor detections_to_mosaic_rows(const std::vector<torch::Tensor>& detections, const torch::Tensor& ratio_pad,
                                        int64_t height, int64_t width);

// The validation plots of the reference into save_dir: PR_curve.png, F1_curve.png, P_curve.png, R_curve.png and,
// when confusion is given ((nc + 1)^2, ConfusionMatrix::matrix()), confusion_matrix.png and
// confusion_matrix_normalized.png.
void plot_validation(const std::string& save_dir, const ApPerClass& stats, const torch::Tensor& confusion,
                     const std::vector<std::string>& names);

}  // namespace yolo8
