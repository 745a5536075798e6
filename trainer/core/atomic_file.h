#pragma once
// Replacing a file whole: readers (and a crash at any moment) see either the previous file or the new one, never
// part of one. Checkpoints, the profile's JSON and memory tables are written this way.

#include <cstddef>
#include <string>

namespace yolo8 {

// Temporary file in the same folder, write, fsync, rename over `path`, fsync the folder. Stale temporaries of dead
// writers are removed. Errors are std::system_error naming the file.
void write_file_atomic(const std::string& path, const void* data, size_t size);
inline void write_file_atomic(const std::string& path, const std::string& text) {
  write_file_atomic(path, text.data(), text.size());
}

}  // namespace yolo8
