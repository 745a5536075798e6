#pragma once
// The usage history `quotad recommend` reads from quotad's store (read-only, either backend): leases and their
// utilisation samples within a window.
#include <cstdint>
#include <string>

#include "quota/core/policy.h"
#include "quota/core/recommend.h"
#include "quota/store/store.h"

namespace yolo8::quota {

// Leases requested before `to_ms` that were still open at `from_ms`, with the GPU-hours their heartbeat samples
// cover inside the window (from the whole hour `from_ms` falls in: heartbeats older than the retention period are
// kept as hourly summaries) and those below the policy's waste threshold. Throws std::runtime_error naming the
// database when it cannot be read.
UsageHistory load_history(const std::string& db, const Policy& policy, int64_t from_ms, int64_t to_ms);
// The same through a reader already open (the monthly report's; open_report_reader).
UsageHistory load_history(ReportReader& reader, const Policy& policy, int64_t from_ms, int64_t to_ms);

}  // namespace yolo8::quota
