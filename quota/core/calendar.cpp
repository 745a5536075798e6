#include "quota/core/calendar.h"

#include <date/date.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

namespace yolo8::quota {
namespace {

using Milliseconds = date::sys_time<std::chrono::milliseconds>;

Milliseconds instant(int64_t ms) { return Milliseconds(std::chrono::milliseconds(ms)); }

int64_t epoch_ms(date::sys_days day) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(day.time_since_epoch()).count();
}

bool digits(const std::string& text, size_t from, size_t count) {
  return std::all_of(text.begin() + static_cast<std::ptrdiff_t>(from),
                     text.begin() + static_cast<std::ptrdiff_t>(from + count),
                     [](char character) { return character >= '0' && character <= '9'; });
}

std::string key_of(date::year_month month) {
  char text[16];
  std::snprintf(text, sizeof(text), "%04d-%02u", static_cast<int>(month.year()), static_cast<unsigned>(month.month()));
  return text;
}

// "YYYY-MM" exactly, month 01..12.
std::optional<date::year_month> parse_month(const std::string& text) {
  if (text.size() != 7 || text[4] != '-' || !digits(text, 0, 4) || !digits(text, 5, 2)) return std::nullopt;
  const date::year_month month{date::year{std::stoi(text.substr(0, 4))},
                               date::month{static_cast<unsigned>(std::stoi(text.substr(5, 2)))}};
  if (!month.ok()) return std::nullopt;
  return month;
}

}  // namespace

int weekday_of(int64_t ms_local) {
  // ISO numbering is Monday = 1 .. Sunday = 7
  return static_cast<int>(date::weekday(date::floor<date::days>(instant(ms_local))).iso_encoding()) - 1;
}

int minute_of_day(int64_t ms_local) {
  const Milliseconds at = instant(ms_local);
  return static_cast<int>(date::floor<std::chrono::minutes>(at - date::floor<date::days>(at)).count());
}

bool in_weekly_window(int64_t ms_utc, int utc_offset_min, const std::vector<int>& weekdays, int from_min, int to_min) {
  const int64_t local = ms_utc + static_cast<int64_t>(utc_offset_min) * 60000;
  const int minute = minute_of_day(local);
  const int day = weekday_of(local);
  auto has_day = [&](int weekday) { return std::find(weekdays.begin(), weekdays.end(), weekday) != weekdays.end(); };
  if (from_min <= to_min) return has_day(day) && minute >= from_min && minute < to_min;
  // the part after midnight belongs to the previous day's window
  if (minute >= from_min) return has_day(day);
  if (minute < to_min) return has_day((day + 6) % 7);
  return false;
}

std::string month_key(int64_t ms_utc) {
  const date::year_month_day day(date::floor<date::days>(instant(ms_utc)));
  return key_of(day.year() / day.month());
}

std::string previous_month_key(const std::string& month) {
  const auto parsed = parse_month(month);
  return parsed ? key_of(*parsed - date::months{1}) : month;
}

std::string next_month_key(const std::string& month) {
  const auto parsed = parse_month(month);
  return parsed ? key_of(*parsed + date::months{1}) : month;
}

std::optional<MonthSpan> month_span(const std::string& month) {
  const auto parsed = parse_month(month);
  if (!parsed) return std::nullopt;
  const date::year_month next = *parsed + date::months{1};
  return MonthSpan{epoch_ms(date::sys_days(*parsed / 1)), epoch_ms(date::sys_days(next / 1))};
}

std::string quarter_of(const std::string& month) {
  const int number = std::stoi(month.substr(5, 2));
  return month.substr(0, 4) + "-Q" + std::to_string((number - 1) / 3 + 1);
}

std::optional<std::vector<std::string>> quarter_month_keys(const std::string& quarter) {
  if (quarter.size() != 7 || !digits(quarter, 0, 4) || quarter[4] != '-' || quarter[5] != 'Q' || quarter[6] < '1' ||
      quarter[6] > '4') {
    return std::nullopt;
  }
  const date::year_month first{date::year{std::stoi(quarter.substr(0, 4))},
                               date::month{static_cast<unsigned>((quarter[6] - '1') * 3 + 1)}};
  return std::vector<std::string>{key_of(first), key_of(first + date::months{1}), key_of(first + date::months{2})};
}

std::optional<int> utc_offset_min(const std::string& timezone) {
  if (timezone == "UTC" || timezone == "Z" || timezone == "Etc/UTC" || timezone == "GMT") return 0;
  const std::string offset = timezone.rfind("UTC", 0) == 0 ? timezone.substr(3) : timezone;
  if (offset.size() != 6 || (offset[0] != '+' && offset[0] != '-') || !digits(offset, 1, 2) || offset[3] != ':' ||
      !digits(offset, 4, 2)) {
    return std::nullopt;
  }
  const int hours = std::stoi(offset.substr(1, 2));
  const int minutes = std::stoi(offset.substr(4, 2));
  if (hours > 14 || minutes >= 60) return std::nullopt;
  return (offset[0] == '-' ? -1 : 1) * (hours * 60 + minutes);
}

std::string utc_text(int64_t ms, const char* format) {
  return date::format(format, date::floor<std::chrono::seconds>(instant(ms)));
}

std::string utc_minutes(int64_t ms) { return utc_text(ms, "%Y-%m-%d %H:%M"); }

}  // namespace yolo8::quota
