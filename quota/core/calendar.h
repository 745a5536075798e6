#pragma once
// The calendar of the quota service in one place: weekdays and minutes of a local day (burst windows), UTC months
// and quarters (credits, the ledger, the reports), fixed UTC offsets and UTC text. Pure functions on epoch
// milliseconds over Howard Hinnant's date library (date.h, header-only; no time-zone database: offsets are
// fixed). Parsers return nothing for a bad text; the callers name the setting or argument in their error.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace yolo8::quota {

// Of the local time `ms_local` (UTC milliseconds shifted by the offset): 0 = Monday .. 6 = Sunday.
int weekday_of(int64_t ms_local);
// Minutes after local midnight, 0..1439.
int minute_of_day(int64_t ms_local);

// Whether the UTC instant `ms_utc` falls in a weekly window at the fixed offset `utc_offset_min`: on the local
// days `weekdays` (0 = Monday), from `from_min` (inclusive) to `to_min` (exclusive) minutes after local midnight.
// A window with to_min < from_min wraps past midnight and belongs to the day it starts on.
bool in_weekly_window(int64_t ms_utc, int utc_offset_min, const std::vector<int>& weekdays, int from_min, int to_min);

// "YYYY-MM" of a UTC instant.
std::string month_key(int64_t ms_utc);
// The month before / after "YYYY-MM" (as given if it is not one).
std::string previous_month_key(const std::string& month);
std::string next_month_key(const std::string& month);

struct MonthSpan {
  int64_t start_ms = 0;  // first millisecond of the month, UTC
  int64_t end_ms = 0;    // first millisecond of the next month
};
// The UTC span of exactly "YYYY-MM" (month 01..12); nothing otherwise.
std::optional<MonthSpan> month_span(const std::string& month);

// "YYYY-Qn" of "YYYY-MM".
std::string quarter_of(const std::string& month);
// The three months of exactly "YYYY-Qn" (n 1..4); nothing otherwise.
std::optional<std::vector<std::string>> quarter_month_keys(const std::string& quarter);

// Minutes east of UTC of "UTC", "Z", "GMT", "Etc/UTC", "+HH:MM", "-HH:MM" or "UTC+HH:MM" (at most 14 hours);
// nothing for anything else (named zones among them).
std::optional<int> utc_offset_min(const std::string& timezone);

// The UTC instant `ms` (whole seconds) written with a strftime-style format, e.g. "%Y-%m-%d %H:%M".
std::string utc_text(int64_t ms, const char* format);
// "YYYY-MM-DD HH:MM" in UTC: the reports' and the statement's times.
std::string utc_minutes(int64_t ms);

}  // namespace yolo8::quota
