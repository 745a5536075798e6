#include "quota/core/calendar.h"

#include <gtest/gtest.h>

// Expected instants and weekdays are Python's datetime (UTC), not this code's arithmetic.
namespace yolo8::quota {
namespace {

constexpr int64_t kMonday = 1795996800000;     // 2026-11-30T00:00:00Z, a Monday
constexpr int64_t kLeapDayEnd = 951868799999;  // 2000-02-29T23:59:59.999Z, a Tuesday
constexpr int64_t kHour = 3600000;

TEST(Calendar, WeekdayAndMinuteOfDayAlsoBeforeTheEpoch) {
  EXPECT_EQ(weekday_of(kMonday), 0);
  EXPECT_EQ(weekday_of(kMonday - 1), 6);  // Sunday 23:59:59.999
  EXPECT_EQ(weekday_of(kLeapDayEnd), 1);
  EXPECT_EQ(weekday_of(4102444800000), 4);  // 2100-01-01, a Friday
  EXPECT_EQ(weekday_of(-1), 2);             // 1969-12-31, a Wednesday
  EXPECT_EQ(minute_of_day(-1), 1439);
  EXPECT_EQ(minute_of_day(kMonday + 9 * kHour + 30 * 60000 + 59999), 570);
  EXPECT_EQ(minute_of_day(kLeapDayEnd), 1439);
}

// Fri 22:00 - 02:00 at +01:00: Friday's window runs into Saturday, and Sunday night's is not Monday's.
TEST(Calendar, AWeeklyWindowAtAnOffsetWrapsPastMidnightOnTheDayItStarts) {
  const std::vector<int> friday = {4};
  const int64_t friday_local = kMonday - 3 * 24 * kHour;  // Fri 2026-11-27 00:00 UTC
  auto in = [&](int64_t ms_utc) { return in_weekly_window(ms_utc, 60, friday, 22 * 60, 2 * 60); };
  EXPECT_FALSE(in(friday_local + 20 * kHour + 59 * 60000));  // 21:59 local
  EXPECT_TRUE(in(friday_local + 21 * kHour));                // 22:00 local
  EXPECT_TRUE(in(friday_local + 24 * kHour + 59 * 60000));   // Sat 01:59 local
  EXPECT_FALSE(in(friday_local + 25 * kHour));               // Sat 02:00 local
  EXPECT_FALSE(in(friday_local - 3 * kHour));                // Thu 22:00 local: not Thursday's
  const std::vector<int> weekdays = {0, 1, 2, 3, 4};
  EXPECT_TRUE(in_weekly_window(kMonday + 8 * kHour, 60, weekdays, 9 * 60, 12 * 60));  // Mon 09:00 at +01:00
  EXPECT_FALSE(in_weekly_window(kMonday + 11 * kHour, 60, weekdays, 9 * 60, 12 * 60));
  EXPECT_TRUE(in_weekly_window(kMonday + 23 * kHour, 0, weekdays, 0, 24 * 60));  // to 24:00
  EXPECT_FALSE(in_weekly_window(kMonday - kHour, 0, weekdays, 0, 24 * 60));      // Sunday
}

TEST(Calendar, MonthsStepAcrossYearsAndLeapFebruaries) {
  EXPECT_EQ(month_key(kMonday), "2026-11");
  EXPECT_EQ(month_key(kMonday + 24 * kHour), "2026-12");
  EXPECT_EQ(month_key(kLeapDayEnd), "2000-02");
  EXPECT_EQ(month_key(-1), "1969-12");
  EXPECT_EQ(previous_month_key("2026-01"), "2025-12");
  EXPECT_EQ(next_month_key("2026-12"), "2027-01");
  EXPECT_EQ(next_month_key("2026-09"), "2026-10");
  EXPECT_EQ(next_month_key("nov"), "nov");  // not a month: as given
  const auto december = month_span("2026-12");
  ASSERT_TRUE(december);
  EXPECT_EQ(december->start_ms, 1796083200000);
  EXPECT_EQ(december->end_ms, 1798761600000);
  const auto leap = month_span("2028-02");
  ASSERT_TRUE(leap);
  EXPECT_EQ(leap->start_ms, 1832976000000);
  EXPECT_EQ(leap->end_ms, 1835481600000);  // 29 days
  EXPECT_EQ(month_span("1969-12")->start_ms, -2678400000);
  for (const char* bad : {"2026-13", "2026-00", "2026-1", "2026/11", "nov", "2026-11 ", "", "-026-11"}) {
    EXPECT_FALSE(month_span(bad)) << bad;
  }
}

TEST(Calendar, QuartersAreExactlyYearDashQOneToFour) {
  EXPECT_EQ(quarter_of("2026-11"), "2026-Q4");
  EXPECT_EQ(quarter_of("2027-03"), "2027-Q1");
  EXPECT_EQ(quarter_month_keys("2026-Q3"), (std::vector<std::string>{"2026-07", "2026-08", "2026-09"}));
  for (const char* bad : {"2026-Q5", "2026-Q0", "2026Q4", "2026-q4", "26-Q4", "2026-Q4 ", ""}) {
    EXPECT_FALSE(quarter_month_keys(bad)) << bad;
  }
}

TEST(Calendar, FixedOffsetsOnlyAndAtMostFourteenHours) {
  EXPECT_EQ(utc_offset_min("UTC"), 0);
  EXPECT_EQ(utc_offset_min("Z"), 0);
  EXPECT_EQ(utc_offset_min("+05:30"), 330);
  EXPECT_EQ(utc_offset_min("UTC-03:00"), -180);
  EXPECT_EQ(utc_offset_min("+14:00"), 840);
  for (const char* bad : {"Europe/Paris", "+15:00", "+05:60", "+5:30", "05:30", "+05:30 ", "UTC+", "+-1:00", ""}) {
    EXPECT_FALSE(utc_offset_min(bad)) << bad;
  }
}

TEST(Calendar, UtcTextIsInWholeSeconds) {
  EXPECT_EQ(utc_minutes(kMonday + 9 * kHour + 30 * 60000 + 59999), "2026-11-30 09:30");
  EXPECT_EQ(utc_text(kLeapDayEnd, "%Y-%m-%d %H:%M:%S UTC"), "2000-02-29 23:59:59 UTC");
  EXPECT_EQ(utc_text(-1, "%Y-%m-%d %H:%M:%S"), "1969-12-31 23:59:59");
}

}  // namespace
}  // namespace yolo8::quota
