// CheckpointWriter: files reach the disk in order on the writer's thread, write() does not wait for the disk,
// wait() and the destructor do, a file given as an encoder is encoded on the writer's thread, and a failed write or
// encoding surfaces at the next wait().
#include "trainer/core/checkpoint_writer.h"

#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <future>
#include <iterator>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace yolo8 {
namespace {

namespace fs = std::filesystem;

struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& name)
      : path(fs::temp_directory_path() / ("yolo8_ckw_" + name + "_" + std::to_string(::getpid()))) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

std::vector<char> bytes_of(const std::string& text) { return {text.begin(), text.end()}; }

std::string read(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST(CheckpointWriter, WritesEveryFileInOrderAndTheLastOfAPathWins) {
  TempDir dir("order");
  std::vector<std::string> written;
  {
    CheckpointWriter writer([&](const std::string& path) { written.push_back(fs::path(path).filename().string()); });
    writer.write((dir.path / "last.pt").string(), bytes_of("epoch 1"));
    writer.write((dir.path / "best.pt").string(), bytes_of("best 1"));
    writer.write((dir.path / "last.pt").string(), bytes_of("epoch 2"));
    writer.wait();
    EXPECT_EQ(writer.pending(), 0u);
  }
  EXPECT_EQ(written, (std::vector<std::string>{"last.pt", "best.pt", "last.pt"}));
  EXPECT_EQ(read(dir.path / "last.pt"), "epoch 2");
  EXPECT_EQ(read(dir.path / "best.pt"), "best 1");
}

// write() returns while an earlier file is still being written: the caller goes on training.
TEST(CheckpointWriter, WriteDoesNotWaitForTheDisk) {
  TempDir dir("async");
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<int> done{0};
  CheckpointWriter writer([&](const std::string&) {
    released.wait();  // the first file's writer is held here, after its rename
    ++done;
  });
  writer.write((dir.path / "a.pt").string(), bytes_of("a"));
  writer.write((dir.path / "b.pt").string(), std::vector<char>(8 << 20, 'b'));
  EXPECT_EQ(done.load(), 0);
  EXPECT_GE(writer.pending(), 1u);
  release.set_value();
  writer.wait();
  EXPECT_EQ(done.load(), 2);
  EXPECT_EQ(fs::file_size(dir.path / "b.pt"), 8u << 20);
}

TEST(CheckpointWriter, DestructorWaitsForPendingFiles) {
  TempDir dir("dtor");
  {
    CheckpointWriter writer;
    for (int i = 0; i < 4; ++i)
      writer.write((dir.path / ("f" + std::to_string(i))).string(), std::vector<char>(4 << 20, 'x'));
  }
  for (int i = 0; i < 4; ++i) EXPECT_EQ(fs::file_size(dir.path / ("f" + std::to_string(i))), 4u << 20) << i;
}

// A file that cannot be written (its folder is gone) fails at the next wait(), naming the file; the files after it
// are still written, and the writer takes files again after the error was seen.
TEST(CheckpointWriter, AFailedWriteSurfacesAtTheNextWait) {
  TempDir dir("error");
  CheckpointWriter writer;
  const fs::path missing = dir.path / "gone" / "last.pt";
  writer.write(missing.string(), bytes_of("x"));
  writer.write((dir.path / "best.pt").string(), bytes_of("best"));
  try {
    writer.wait();
    FAIL() << "wait() did not throw";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("last.pt"), std::string::npos) << e.what();
  }
  EXPECT_EQ(read(dir.path / "best.pt"), "best");
  writer.write((dir.path / "last.pt").string(), bytes_of("again"));
  EXPECT_NO_THROW(writer.wait());
  EXPECT_EQ(read(dir.path / "last.pt"), "again");
}

// The training loop hands over a snapshot to encode: the encoding runs on the writer's thread, in the files' order,
// and what it throws fails that file only, at the next wait(), naming the file with the encoder's message.
TEST(CheckpointWriter, EncodersRunOnTheWritersThreadAndTheirErrorsSurfaceAtTheNextWait) {
  TempDir dir("encode");
  CheckpointWriter writer;
  std::thread::id encoded_on;
  writer.write((dir.path / "last.pt").string(), [&encoded_on] {
    encoded_on = std::this_thread::get_id();
    return bytes_of("encoded");
  });
  writer.write((dir.path / "best.pt").string(),
               []() -> std::vector<char> { throw std::runtime_error("snapshot could not be encoded"); });
  writer.write((dir.path / "epoch1.pt").string(), bytes_of("after"));
  try {
    writer.wait();
    FAIL() << "wait() did not throw";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("could not be encoded"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("best.pt"), std::string::npos) << e.what();
  }
  EXPECT_NE(encoded_on, std::thread::id());
  EXPECT_NE(encoded_on, std::this_thread::get_id());
  EXPECT_EQ(read(dir.path / "last.pt"), "encoded");
  EXPECT_FALSE(fs::exists(dir.path / "best.pt"));
  EXPECT_EQ(read(dir.path / "epoch1.pt"), "after");
}

}  // namespace
}  // namespace yolo8
