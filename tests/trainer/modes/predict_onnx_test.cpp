// `yolo8 predict model=X.onnx`: the exported file run through OpenCV DNN gives the detections the weights give,
// image by image, on the val golden case's real photos and its Ultralytics-trained checkpoint.
#include <sys/wait.h>

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "../process_util.h"

namespace yolo8 {
namespace {

namespace fs = std::filesystem;

struct Detection {
  int cls = 0;
  double cx = 0, cy = 0, w = 0, h = 0, conf = 0;
};

std::vector<Detection> read_labels(const fs::path& file) {
  std::vector<Detection> out;
  std::ifstream in(file);
  Detection d;
  while (in >> d.cls >> d.cx >> d.cy >> d.w >> d.h >> d.conf) out.push_back(d);
  return out;
}

using test::read_text;

int run_yolo8(const std::vector<std::string>& args, const fs::path& log) {
  const pid_t child = test::spawn_yolo8(args, {}, log.string());
  int status = 0;
  waitpid(child, &status, 0);
  return test::exit_code_of(status);
}

TEST(PredictOnnx, OpenCvDnnGivesTheDetectionsOfTheWeights) {
  const fs::path fixtures = fs::path(test::kFixturesDir) / "val_case";
  const fs::path out = fs::path(test::kBinaryDir) / "test-output" / "predict_onnx";
  fs::remove_all(out);
  fs::create_directories(out);
  const std::string weights = (fixtures / "yolov8n-val-case.pt").string();
  const std::string onnx = (out / "val-case.onnx").string();
  ASSERT_EQ(run_yolo8({"export", "model=" + weights, "format=onnx", "imgsz=160", "out=" + onnx}, out / "export.log"), 0)
      << read_text(out / "export.log");
  const std::vector<std::string> common{"source=" + (fixtures / "images" / "val").string(),
                                        "imgsz=160",
                                        "conf=0.05",
                                        "save_txt",
                                        "save_conf",
                                        "save=false",
                                        "device=cpu",
                                        "threads=1",
                                        "project=" + out.string()};
  std::vector<std::string> pt_args{"predict", "model=" + weights, "name=pt"};
  std::vector<std::string> onnx_args{"predict", "model=" + onnx, "name=onnx"};
  pt_args.insert(pt_args.end(), common.begin(), common.end());
  onnx_args.insert(onnx_args.end(), common.begin(), common.end());
  ASSERT_EQ(run_yolo8(pt_args, out / "pt.log"), 0) << read_text(out / "pt.log");
  ASSERT_EQ(run_yolo8(onnx_args, out / "onnx.log"), 0) << read_text(out / "onnx.log");
  const std::string onnx_log = read_text(out / "onnx.log");
  EXPECT_NE(onnx_log.find("through OpenCV DNN"), std::string::npos) << onnx_log;
  EXPECT_NE(onnx_log.find("input 160x160 fixed by the graph"), std::string::npos) << onnx_log;
  // The weights pad to the stride only, the static graph takes 160x160: the photos whose height is 258..320 get the
  // same 160x160 input from both (gain 1/2) and are compared; the landscape ones (128x160 for the weights) are not.
  const std::string pt_log = read_text(out / "pt.log");
  std::set<std::string> same_input;
  for (size_t at = pt_log.find(".jpg: 160x160 "); at != std::string::npos; at = pt_log.find(".jpg: 160x160 ", at + 1)) {
    same_input.insert(pt_log.substr(at - 5, 5) + ".txt");
  }
  ASSERT_GE(same_input.size(), 20U) << pt_log;

  int compared = 0;
  for (const auto& entry : fs::directory_iterator(out / "pt" / "labels")) {
    if (same_input.count(entry.path().filename().string()) == 0) continue;
    const std::vector<Detection> want = read_labels(entry.path());
    const std::vector<Detection> got = read_labels(out / "onnx" / "labels" / entry.path().filename());
    ASSERT_EQ(got.size(), want.size()) << entry.path().filename();
    for (const Detection& w : want) {
      bool matched = false;
      for (const Detection& g : got) {
        matched |= g.cls == w.cls && std::abs(g.cx - w.cx) < 1e-4 && std::abs(g.cy - w.cy) < 1e-4 &&
                   std::abs(g.w - w.w) < 1e-4 && std::abs(g.h - w.h) < 1e-4 && std::abs(g.conf - w.conf) < 1e-4;
      }
      EXPECT_TRUE(matched) << entry.path().filename() << ": class " << w.cls << " at " << w.cx << "," << w.cy
                           << " conf " << w.conf << " has no ONNX twin";
      ++compared;
    }
  }
  std::cout << compared << " detections compared\n";
  EXPECT_GT(compared, 20);
}

}  // namespace
}  // namespace yolo8
