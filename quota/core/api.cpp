#include "quota/core/api.h"

#include <chrono>

namespace yolo8::quota {

int64_t system_now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

ApiResponse error_response(int status, const std::string& reason) {
  ApiResponse response;
  response.status = status;
  response.body = nlohmann::json{{"error", status}, {"reason", reason}};
  return response;
}

}  // namespace yolo8::quota
