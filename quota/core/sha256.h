#pragma once
// Minimal SHA-256 (FIPS 180-4) for hashing bearer tokens; not for bulk data.
#include <string>

namespace yolo8::quota {

// Lower-case hex digest of `data`.
std::string sha256_hex(const std::string& data);

}  // namespace yolo8::quota
