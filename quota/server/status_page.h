#pragma once
// quotad's read-only status page at `/`: plain HTML with inline CSS, no scripts, no external assets.
#include <cstdint>
#include <string>

#include "quota/core/engine.h"
#include "quota/core/usage.h"
#include "quota/service/service.h"

namespace yolo8::quota {

// Teams with usage-vs-quota bars, running leases, the queue and the waste list at `now_ms`.
// The page refreshes itself every `refresh_s` seconds through a meta tag (0: never).
std::string render_status_page(const Policy& policy, const Engine& engine, const UtilTracker& tracker, int64_t now_ms,
                               int refresh_s = 30);

// The page for a running service.
std::string render_status_page(QuotaService& service);

// quotad's icon (GET /favicon.ico): a 16x16 ICO, so browsers showing the status page get no 404.
std::string favicon_ico();

// What a trainer last reported of its GPU's memory (NVML): "process 4.1 GiB of device 12.5 GiB" (its own
// process, the CUDA context included, against every process's on the device: on a shared GPU the device's is
// every lease's sum), "device 12.5 GiB" when only the device's is known, "" when neither.
std::string device_memory_text(double process_gib, double device_gib);

std::string html_escape(const std::string& text);
// "1 h 05 min", "42 s"
std::string format_duration_ms(int64_t ms);

}  // namespace yolo8::quota
