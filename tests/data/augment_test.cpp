// Augmentation primitives: rect shapes, letterbox padding, flips, candidates, mosaic placement, RNG.
#include "data/augment.h"

#include <gtest/gtest.h>
#include <opencv2/core.hpp>
#include <opencv2/imgproc.hpp>

#include <algorithm>
#include <cmath>

namespace yolo8::data {
namespace {

TEST(DataRectShapes, ReferenceFormula) {
  // Already sorted by h/w: 0.5, 0.6 | 1.333.
  auto shapes = rect_batch_shapes({{200, 400}, {300, 500}, {400, 300}}, 2, 640, 32, 0.5);
  ASSERT_EQ(shapes.size(), 2u);
  EXPECT_EQ(shapes[0], std::make_pair(416, 672));
  EXPECT_EQ(shapes[1], std::make_pair(672, 512));
  auto train = rect_batch_shapes({{640, 640}}, 4, 640, 32, 0.0);
  EXPECT_EQ(train[0], std::make_pair(640, 640));
  auto order = aspect_order({{400, 300}, {200, 400}, {300, 500}});
  EXPECT_EQ(order, (std::vector<size_t>{1, 2, 0}));
}

TEST(DataLetterbox, OddPaddingGoesBottomRight) {
  cv::Mat img(51, 100, CV_8UC3, cv::Scalar(10, 20, 30));
  LetterboxInfo lb;
  cv::Mat out = letterbox(img, 64, 64, true, &lb);
  EXPECT_EQ(out.size(), cv::Size(64, 64));
  EXPECT_EQ(lb.new_w, 64);
  EXPECT_EQ(lb.new_h, 33);
  EXPECT_EQ(lb.top, 15);
  EXPECT_EQ(out.at<cv::Vec3b>(14, 10), cv::Vec3b(114, 114, 114));
  EXPECT_EQ(out.at<cv::Vec3b>(15, 10), cv::Vec3b(10, 20, 30));
  EXPECT_EQ(out.at<cv::Vec3b>(47, 10), cv::Vec3b(10, 20, 30));
  EXPECT_EQ(out.at<cv::Vec3b>(48, 10), cv::Vec3b(114, 114, 114));
  // No upscaling when scaleup is off.
  cv::Mat small(20, 10, CV_8UC3, cv::Scalar::all(0));
  letterbox(small, 64, 64, false, &lb);
  EXPECT_EQ(lb.ratio, 1.0);
  EXPECT_EQ(lb.left, 27);
}

// Ultralytics 8.0.232's LetterBox adds the unrounded half padding to the labels, the rounded one to the image.
TEST(DataLetterbox, LabelsMoveByTheUnroundedHalfPadding) {
  cv::Mat img(51, 100, CV_8UC3, cv::Scalar::all(0));
  LetterboxInfo lb;
  letterbox(img, 64, 64, true, &lb);
  EXPECT_EQ(lb.top, 15);
  EXPECT_EQ(lb.label_pad_h, 15.5);  // 31 rows of padding
  EXPECT_EQ(lb.left, 0);
  EXPECT_EQ(lb.label_pad_w, 0.0);
  cv::Mat small(20, 9, CV_8UC3, cv::Scalar::all(0));
  letterbox(small, 64, 64, false, &lb);
  EXPECT_EQ(lb.left, 27);
  EXPECT_EQ(lb.label_pad_w, 27.5);
  EXPECT_EQ(lb.top, 22);
  EXPECT_EQ(lb.label_pad_h, 22.0);
}

TEST(DataResizeLongSide, CeilAndCap) {
  cv::Mat img(300, 500, CV_8UC3, cv::Scalar::all(0));
  cv::Mat r = resize_long_side(img, 640);
  EXPECT_EQ(r.cols, 640);
  EXPECT_EQ(r.rows, 384);
  cv::Mat s = resize_long_side(img, 128);
  EXPECT_EQ(s.cols, 128);
  EXPECT_EQ(s.rows, 77);  // ceil(76.8)
}

TEST(DataFlips, BoxesFollowPixels) {
  cv::Mat img(40, 60, CV_8UC3, cv::Scalar::all(0));
  img(cv::Rect(5, 10, 10, 8)).setTo(cv::Scalar(255, 255, 255));
  std::vector<PixBox> b = {{1, 5, 10, 15, 18}};
  flip_lr(img, b);
  EXPECT_FLOAT_EQ(b[0].x1, 45);
  EXPECT_FLOAT_EQ(b[0].x2, 55);
  EXPECT_EQ(img.at<cv::Vec3b>(12, 45)[0], 255);
  EXPECT_EQ(img.at<cv::Vec3b>(12, 44)[0], 0);
  flip_ud(img, b);
  EXPECT_FLOAT_EQ(b[0].y1, 22);
  EXPECT_FLOAT_EQ(b[0].y2, 30);
  EXPECT_EQ(img.at<cv::Vec3b>(22, 50)[0], 255);
  EXPECT_EQ(img.at<cv::Vec3b>(21, 50)[0], 0);
}

TEST(DataBoxCandidate, Thresholds) {
  PixBox before{0, 0, 0, 100, 100};
  EXPECT_TRUE(box_candidate(before, {0, 0, 0, 50, 50}, 1.0));   // area ratio 0.25
  EXPECT_FALSE(box_candidate(before, {0, 0, 0, 30, 30}, 1.0));  // 0.09 <= 0.1
  EXPECT_TRUE(box_candidate(before, {0, 0, 0, 30, 30}, 0.5));   // before scaled to 50x50
  EXPECT_FALSE(box_candidate(before, {0, 0, 0, 2, 80}, 0.1));   // width not > 2 px
  PixBox thin{0, 0, 0, 1000, 5};
  EXPECT_FALSE(box_candidate(thin, {0, 0, 0, 1000, 5}, 1.0));  // aspect 200 >= 100
}

TEST(DataRng, DeterministicPerSample) {
  Rng a(Rng::mix(1, 2, 3)), b(Rng::mix(1, 2, 3)), c(Rng::mix(1, 2, 4)), d(Rng::mix(1, 3, 3));
  double x = a.uniform(), y = b.uniform();
  EXPECT_EQ(x, y);
  EXPECT_NE(x, c.uniform());
  EXPECT_NE(x, d.uniform());
  for (int i = 0; i < 1000; ++i) {
    double u = a.uniform(-2, 3);
    ASSERT_GE(u, -2);
    ASSERT_LT(u, 3);
    int64_t k = a.randint(7);
    ASSERT_GE(k, 0);
    ASSERT_LT(k, 7);
  }
  double m = 0;
  for (int i = 0; i < 2000; ++i) m += a.beta(32, 32);
  EXPECT_NEAR(m / 2000, 0.5, 0.01);
}

TEST(DataMosaic, TilesAndBoxesAgree) {
  const int s = 64;
  cv::Mat tiles_img[4];
  std::vector<PixBox> tile_boxes[4];
  const cv::Scalar colours[4] = {{255, 0, 0}, {0, 255, 0}, {0, 0, 255}, {255, 255, 0}};
  Tile tiles[4];
  for (int i = 0; i < 4; ++i) {
    tiles_img[i] = cv::Mat(48, 64, CV_8UC3, cv::Scalar::all(40));
    tiles_img[i](cv::Rect(20, 12, 24, 24)).setTo(colours[i]);
    tile_boxes[i] = {{static_cast<float>(i), 20, 12, 44, 36}};
    tiles[i] = {&tiles_img[i], &tile_boxes[i]};
  }
  for (uint64_t seed = 0; seed < 20; ++seed) {
    Rng rng(seed);
    cv::Mat canvas;
    std::vector<PixBox> boxes;
    mosaic4(tiles, s, rng, canvas, boxes);
    ASSERT_EQ(canvas.size(), cv::Size(2 * s, 2 * s));
    ASSERT_EQ(boxes.size(), 4u);
    for (const auto& b : boxes) {
      const int cls = static_cast<int>(b.cls);
      const int w = static_cast<int>(b.x2 - b.x1), h = static_cast<int>(b.y2 - b.y1);
      if (w <= 0 || h <= 0) continue;
      cv::Mat roi = canvas(cv::Rect(static_cast<int>(b.x1), static_cast<int>(b.y1), w, h));
      cv::Mat mask;
      cv::inRange(roi, colours[cls], colours[cls], mask);
      EXPECT_EQ(cv::countNonZero(mask), w * h) << "seed " << seed << " class " << cls;
    }
  }
}

// Flips folded into the warp equal a separate cv::flip, pixels and boxes.
TEST(DataPerspective, FoldedFlipsEqualSeparateFlips) {
  cv::Mat img(48, 64, CV_8UC3);
  cv::randu(img, cv::Scalar::all(0), cv::Scalar::all(255));
  // Smooth: the warp's 1/32-px fixed-point grid rounds mirrored coordinates differently.
  cv::GaussianBlur(img, img, cv::Size(9, 9), 3);
  AugmentConfig cfg;
  cfg.degrees = 10;
  for (int mode = 1; mode < 4; ++mode) {
    const bool lr = mode & 1, ud = mode & 2;
    std::vector<PixBox> b1 = {{0, 10, 8, 30, 30}}, b2 = b1;
    Rng r1(9), r2(9);
    cv::Mat a, b;
    random_perspective(img, b1, cfg, 0, r1, a, lr, ud);
    random_perspective(img, b2, cfg, 0, r2, b);
    if (ud) flip_ud(b, b2);
    if (lr) flip_lr(b, b2);
    EXPECT_LE(cv::norm(a, b, cv::NORM_INF), 2) << "mode " << mode;
    EXPECT_LT(cv::norm(a, b, cv::NORM_L1) / a.total(), 0.5) << "mode " << mode;
    ASSERT_EQ(b1.size(), b2.size());
    for (size_t i = 0; i < b1.size(); ++i) {
      EXPECT_NEAR(b1[i].x1, b2[i].x1, 1e-3);
      EXPECT_NEAR(b1[i].y1, b2[i].y1, 1e-3);
      EXPECT_NEAR(b1[i].x2, b2[i].x2, 1e-3);
      EXPECT_NEAR(b1[i].y2, b2[i].y2, 1e-3);
    }
  }
}

// Scale + translation only (the default) takes the resize path; a tiny rotation takes the general warp with the
// same draws. Boxes agree to the half-pixel snap, and in both the pixels sit where the boxes say: the centroid of
// a bright rectangle stays at its box's centre (a one-pixel slip in the snapped mapping would fail).
TEST(DataPerspective, AxisAlignedResizeMatchesGeneralWarp) {
  // Background equal to the fill (114): only the rectangle carries weight in the centroid.
  cv::Mat img(120, 160, CV_8UC3, cv::Scalar::all(114));
  img(cv::Rect(40, 30, 30, 60)).setTo(cv::Scalar::all(250));
  const PixBox rect_box{1, 40, 30, 70, 90};
  AugmentConfig axis, rotated;
  rotated.degrees = 1e-7;
  int checked = 0;
  for (uint64_t seed = 0; seed < 40; ++seed) {
    for (int border : {0, -20}) {
      const bool lr = seed % 2, ud = seed % 3 == 0;
      std::vector<PixBox> ba = {rect_box, {2, 100, 10, 150, 40}}, bb = ba;
      Rng r1(seed), r2(seed);
      cv::Mat a, b;
      random_perspective(img, ba, axis, border, r1, a, lr, ud);
      random_perspective(img, bb, rotated, border, r2, b, lr, ud);
      ASSERT_EQ(a.size(), b.size());
      EXPECT_EQ(r1.uniform(), r2.uniform());  // the same draws consumed
      ASSERT_EQ(ba.size(), bb.size()) << "seed " << seed;
      for (size_t k = 0; k < ba.size(); ++k) {
        EXPECT_NEAR(ba[k].x1, bb[k].x1, 0.75) << "seed " << seed;
        EXPECT_NEAR(ba[k].x2, bb[k].x2, 0.75) << "seed " << seed;
        EXPECT_NEAR(ba[k].y1, bb[k].y1, 0.75) << "seed " << seed;
        EXPECT_NEAR(ba[k].y2, bb[k].y2, 0.75) << "seed " << seed;
      }
      if (ba.empty() || ba[0].cls != 1 || bb.empty() || bb[0].cls != 1) continue;
      const auto& box_a = ba[0];
      // Only rectangles wholly inside the output: a clipped box no longer has the pixels' centroid.
      if (box_a.x1 < 1 || box_a.y1 < 1 || box_a.x2 > a.cols - 1 || box_a.y2 > a.rows - 1) continue;
      int which = 0;
      for (const auto& [out, box] : {std::pair{a, ba[0]}, std::pair{b, bb[0]}}) {
        ++which;
        cv::Mat gray;
        cv::extractChannel(out, gray, 0);
        gray.convertTo(gray, CV_32F, 1.0, -114.0);
        const cv::Moments m = cv::moments(gray);
        // Pixel i covers [i, i + 1): its centre is i + 0.5 in box coordinates.
        // Measured: at most 0.14 px for the resize, 0.42 px for warpAffine (its 1/32-px coordinate grid).
        const double tolerance = which == 1 ? 0.2 : 0.5;
        EXPECT_NEAR(m.m10 / m.m00 + 0.5, (box.x1 + box.x2) / 2, tolerance) << "seed " << seed << " path " << which;
        EXPECT_NEAR(m.m01 / m.m00 + 0.5, (box.y1 + box.y2) / 2, tolerance) << "seed " << seed << " path " << which;
      }
      ++checked;
    }
  }
  EXPECT_GT(checked, 30);
}

// Scale gains near 0 and near 2 (scale=0.999) keep the output size and boxes inside the image, without overflow.
TEST(DataPerspective, ExtremeScalesStayInsideTheImage) {
  cv::Mat img(48, 64, CV_8UC3, cv::Scalar::all(114));
  img(cv::Rect(10, 10, 20, 20)).setTo(cv::Scalar::all(250));
  AugmentConfig cfg;
  cfg.scale = 0.999;
  for (uint64_t seed = 0; seed < 200; ++seed) {
    for (int border : {0, -16}) {
      std::vector<PixBox> boxes = {{0, 10, 10, 30, 30}};
      Rng rng(seed);
      cv::Mat out;
      random_perspective(img, boxes, cfg, border, rng, out, seed % 2, false);
      ASSERT_EQ(out.size(), cv::Size(64 + 2 * border, 48 + 2 * border));
      for (const auto& b : boxes) {
        EXPECT_GE(b.x1, 0);
        EXPECT_LE(b.x2, out.cols);
        EXPECT_GE(b.y1, 0);
        EXPECT_LE(b.y2, out.rows);
      }
    }
  }
}

// The canvas is filled with 114 exactly where no tile lands: a reused canvas full of another colour keeps none of it,
// for tiles smaller than the quarters (gaps on every side) and larger (none).
TEST(DataMosaic, FillCoversEveryGapOfAReusedCanvas) {
  const int s = 64;
  const cv::Vec3b colours[4] = {{200, 10, 10}, {10, 200, 10}, {10, 10, 200}, {200, 200, 10}};
  const cv::Vec3b stale(7, 7, 7), fill(114, 114, 114);
  for (int size : {20, 47, 64, 110}) {
    cv::Mat imgs[4];
    std::vector<PixBox> no_boxes;
    Tile tiles[4];
    for (int i = 0; i < 4; ++i) {
      imgs[i] = cv::Mat(size - 3 * i, size + 5 * i, CV_8UC3, cv::Scalar(colours[i]));
      tiles[i] = {&imgs[i], &no_boxes};
    }
    for (uint64_t seed = 0; seed < 30; ++seed) {
      cv::Mat canvas(2 * s, 2 * s, CV_8UC3, cv::Scalar(stale));
      Rng rng(seed);
      std::vector<PixBox> boxes;
      mosaic4(tiles, s, rng, canvas, boxes);
      int64_t filled = 0, tiled = 0, other = 0;
      for (int y = 0; y < canvas.rows; ++y)
        for (int x = 0; x < canvas.cols; ++x) {
          const cv::Vec3b p = canvas.at<cv::Vec3b>(y, x);
          if (p == fill)
            ++filled;
          else if (p == colours[0] || p == colours[1] || p == colours[2] || p == colours[3])
            ++tiled;
          else
            ++other;
        }
      EXPECT_EQ(other, 0) << "size " << size << " seed " << seed;
      EXPECT_EQ(filled + tiled, 4 * s * s);
      if (size >= 110) {
        EXPECT_EQ(filled, 0) << "seed " << seed;  // every tile larger than any quarter (at most 1.5 s): no gaps
      }
      if (size <= 20) {
        EXPECT_GT(filled, 0) << "seed " << seed;
      }
    }
  }
}

// The table loop equals the reference recipe: BGR->HSV, cv::LUT with the three gains, HSV->BGR.
// The fused mosaic + warp (partial canvas) equals building the whole canvas and warping it.
TEST(DataMosaic, FusedEqualsCanvasThenWarp) {
  const int s = 96;
  cv::Mat imgs[4];
  std::vector<PixBox> bxs[4];
  Tile tiles[4];
  for (int i = 0; i < 4; ++i) {
    imgs[i] = cv::Mat(s - 7 * i, s - 11 * (3 - i), CV_8UC3);
    cv::randu(imgs[i], cv::Scalar::all(0), cv::Scalar::all(255));
    cv::GaussianBlur(imgs[i], imgs[i], cv::Size(5, 5), 2);
    bxs[i] = {{static_cast<float>(i), 10, 12, 50, 40}, {static_cast<float>(i), 30, 5, 60, 70}};
    tiles[i] = {&imgs[i], &bxs[i]};
  }
  AugmentConfig cfg;
  for (int variant = 0; variant < 3; ++variant) {
    cfg.degrees = variant == 1 ? 30 : 0;
    cfg.shear = variant == 1 ? 10 : 0;
    cfg.perspective = variant == 2 ? 0.0005 : 0;
    for (uint64_t seed = 0; seed < 25; ++seed) {
      Rng r1(seed), r2(seed);
      cv::Mat canvas, a, b, scratch;
      std::vector<PixBox> ba, bb;
      const bool lr = seed % 2, ud = seed % 3 == 0;
      mosaic4(tiles, s, r1, canvas, ba);
      random_perspective(canvas, ba, cfg, -s / 2, r1, a, lr, ud);
      mosaic_perspective(tiles, s, cfg, r2, scratch, b, bb, lr, ud);
      ASSERT_EQ(a.size(), cv::Size(s, s));
      ASSERT_EQ(b.size(), a.size());
      EXPECT_LE(cv::norm(a, b, cv::NORM_INF), 1) << "variant " << variant << " seed " << seed;
      ASSERT_EQ(ba.size(), bb.size());
      for (size_t k = 0; k < ba.size(); ++k) {
        EXPECT_EQ(ba[k].x1, bb[k].x1);
        EXPECT_EQ(ba[k].y2, bb[k].y2);
      }
      if (variant == 0) {
        EXPECT_LT(scratch.total(), canvas.total());  // the point: a smaller canvas
      }
      EXPECT_EQ(r1.uniform(), r2.uniform());  // same draws consumed
    }
  }
}

TEST(DataHsv, MatchesCvLutRecipe) {
  cv::Mat img(37, 53, CV_8UC3);
  cv::randu(img, cv::Scalar::all(0), cv::Scalar::all(255));
  cv::Mat got = img.clone();
  Rng rng(5), ref_rng(5);
  augment_hsv(got, 0.015, 0.7, 0.4, rng);
  const double r0 = ref_rng.uniform(-1, 1) * 0.015 + 1, r1 = ref_rng.uniform(-1, 1) * 0.7 + 1,
               r2 = ref_rng.uniform(-1, 1) * 0.4 + 1;
  cv::Mat lut(1, 256, CV_8UC3), hsv, expected;
  for (int x = 0; x < 256; ++x)
    lut.at<cv::Vec3b>(x) =
        cv::Vec3b(static_cast<uchar>(std::fmod(x * r0, 180.0)), static_cast<uchar>(std::clamp(x * r1, 0.0, 255.0)),
                  static_cast<uchar>(std::clamp(x * r2, 0.0, 255.0)));
  cv::cvtColor(img, hsv, cv::COLOR_BGR2HSV);
  cv::LUT(hsv, lut, hsv);
  cv::cvtColor(hsv, expected, cv::COLOR_HSV2BGR);
  EXPECT_EQ(cv::norm(got, expected, cv::NORM_INF), 0);
  EXPECT_GT(cv::norm(got, img, cv::NORM_INF), 0);
}

TEST(DataHsv, ZeroGainsLeaveImageAlone) {
  cv::Mat img(8, 8, CV_8UC3, cv::Scalar(10, 200, 90));
  cv::Mat copy = img.clone();
  Rng rng(0);
  augment_hsv(img, 0, 0, 0, rng);
  EXPECT_EQ(cv::norm(img, copy, cv::NORM_INF), 0);
  augment_hsv(img, 0.015, 0.7, 0.4, rng);
  EXPECT_GT(cv::norm(img, copy, cv::NORM_INF), 0);
}

}  // namespace
}  // namespace yolo8::data
