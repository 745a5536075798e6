#include "trainer/runtime/build_info.h"

#include <gtest/gtest.h>

namespace yolo8 {
namespace {

constexpr const char* kMaps =
    "7f1c2a000000-7f1c2a200000 r--p 00000000 08:01 1234  /opt/torch/torch/lib/libtorch_cpu.so\n"
    "7f1c2b000000-7f1c2b100000 r-xp 00000000 08:01 1235  /opt/torch/nvidia/cu13/lib/libcudart.so.13\n"
    "7f1c2c000000-7f1c2c100000 r--p 00000000 08:01 1236  /opt/torch/nvidia/cudnn/lib/libcudnn_graph.so.9\n"
    "7f1c2d000000-7f1c2d100000 r--p 00000000 08:01 1237  /opt/torch/nvidia/cudnn/lib/libcudnn.so.9\n"
    "7ffd5e000000-7ffd5e021000 rw-p 00000000 00:00 0     [stack]\n";

TEST(BuildInfo, LoadedLibraryPathIsTheFileTheProcessMappedByItsSoname) {
  EXPECT_EQ(loaded_library_path(kMaps, "libcudart.so"), "/opt/torch/nvidia/cu13/lib/libcudart.so.13");
  // libcudnn_graph.so.9 comes first but is another library.
  EXPECT_EQ(loaded_library_path(kMaps, "libcudnn.so"), "/opt/torch/nvidia/cudnn/lib/libcudnn.so.9");
  EXPECT_EQ(loaded_library_path(kMaps, "libnccl.so"), "");
}

TEST(BuildInfo, TheRunningProcessFindsItsOwnLibTorch) {
  const BuildInfo info = current_build_info();
  EXPECT_NE(info.libtorch_path.find("/libtorch_c"), std::string::npos) << info.libtorch_path;
  EXPECT_NE(describe(info).find(" from " + info.libtorch_path), std::string::npos) << describe(info);
}

}  // namespace
}  // namespace yolo8
