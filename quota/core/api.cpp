#include "quota/core/api.h"

#include <chrono>
#include <cmath>
#include <sstream>

namespace yolo8::quota {

int64_t system_now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string fixed_text(double value, int digits) {
  std::ostringstream stream;
  stream.setf(std::ios::fixed);
  stream.precision(digits);
  stream << (std::fabs(value) < 0.5 * std::pow(10.0, -digits) ? 0.0 : value);
  return stream.str();
}

ApiResponse error_response(int status, const std::string& reason) {
  ApiResponse response;
  response.status = status;
  response.body = nlohmann::json{{"error", status}, {"reason", reason}};
  return response;
}

}  // namespace yolo8::quota
