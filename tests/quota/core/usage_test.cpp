#include "quota/core/usage.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace yolo8::quota {
namespace {

constexpr int64_t kHourMs = 3600000;
constexpr int64_t kStart = 1764547200000;  // 2025-12-01T00:00Z, a whole hour
constexpr double kThreshold = 0.3;

struct Sample {
  int64_t ts_ms;
  double util;
};

// A stream with runs below and above the threshold, samples without a utilisation, repeated times, gaps longer
// than an hour, and utilisations whose products with the gaps are not exact in binary.
std::vector<Sample> random_stream(std::mt19937_64& random, int count) {
  const double lows[] = {0.0, 0.05, 0.1, 0.123456789, 0.2999999};
  const double highs[] = {0.3, 0.5, 0.777777777, 0.9, 1.0};
  std::vector<Sample> out;
  int64_t ts = kStart + static_cast<int64_t>(random() % kHourMs);
  bool low = random() % 2 == 0;
  for (int i = 0; i < count; ++i) {
    const uint64_t gap = random() % 100;
    ts += gap < 3 ? 0 : gap < 6 ? static_cast<int64_t>(random() % (3 * kHourMs)) : 5000 + random() % 15000;
    if (random() % 40 == 0) low = !low;
    double util = low ? lows[random() % 5] : highs[random() % 5];
    if (random() % 50 == 0) util = -1;  // not reported
    out.push_back({ts, util});
  }
  return out;
}

void expect_same(const LeaseUtil& folded, const LeaseUtil& direct, const std::string& where) {
  EXPECT_EQ(folded.first_ts_ms, direct.first_ts_ms) << where;
  EXPECT_EQ(folded.last_ts_ms, direct.last_ts_ms) << where;
  EXPECT_EQ(folded.last_util, direct.last_util) << where;
  EXPECT_EQ(folded.low_since_ms, direct.low_since_ms) << where;
  EXPECT_EQ(folded.util_micro_ms, direct.util_micro_ms) << where;
  EXPECT_EQ(folded.covered_ms, direct.covered_ms) << where;
  EXPECT_EQ(folded.low_held_ms, direct.low_held_ms) << where;
  EXPECT_EQ(folded.wasted_ms, direct.wasted_ms) << where;
  EXPECT_EQ(folded.longest_low_ms, direct.longest_low_ms) << where;
  EXPECT_EQ(folded.samples, direct.samples) << where;
  EXPECT_EQ(folded.avg_util(), direct.avg_util()) << where;
}

UtilSummary summary_of(const std::vector<Sample>& samples, size_t from, size_t to, int64_t waste_after_ms) {
  UtilSummary summary;
  summary.threshold = kThreshold;
  summary.waste_after_ms = waste_after_ms;
  for (size_t i = from; i < to; ++i) summary.add(samples[i].ts_ms, samples[i].util);
  return summary;
}

// The hours' summaries, in order (what fold_heartbeats stores).
std::vector<UtilSummary> hours_of(const std::vector<Sample>& samples, int64_t waste_after_ms) {
  std::vector<UtilSummary> out;
  for (size_t i = 0; i < samples.size();) {
    size_t end = i;
    while (end < samples.size() && hour_of(samples[end].ts_ms) == hour_of(samples[i].ts_ms)) ++end;
    out.push_back(summary_of(samples, i, end, waste_after_ms));
    i = end;
  }
  return out;
}

TEST(QuotaUtilSummary, HourSummariesReplayedGiveExactlyWhatTheSamplesGive) {
  std::mt19937_64 random(7);
  int wasted_streams = 0;
  for (int stream = 0; stream < 200; ++stream) {
    const int64_t waste_after_ms = stream % 2 == 0 ? 60000 : 1800000;
    const std::vector<Sample> samples = random_stream(random, 50 + static_cast<int>(random() % 2000));
    UtilTracker direct(kThreshold, waste_after_ms), folded(kThreshold, waste_after_ms);
    for (const Sample& sample : samples) direct.observe(1, sample.ts_ms, sample.util);
    for (const UtilSummary& hour : hours_of(samples, waste_after_ms)) folded.observe_summary(1, hour);
    ASSERT_NE(direct.find(1), nullptr);
    ASSERT_NE(folded.find(1), nullptr);
    expect_same(*folded.find(1), *direct.find(1), "stream " + std::to_string(stream));
    if (direct.find(1)->wasted_ms > 0) ++wasted_streams;
    // a lease that ended: its open run closes the same way
    const int64_t end = samples.back().ts_ms + 7 * 60000;
    direct.close(1, end);
    folded.close(1, end);
    expect_same(*folded.find(1), *direct.find(1), "stream " + std::to_string(stream) + " closed");
  }
  EXPECT_GT(wasted_streams, 20);  // the streams do have runs long enough to count
}

TEST(QuotaUtilSummary, SummariesOfAnySplitComposeAndMixWithTheNewerSamples) {
  std::mt19937_64 random(11);
  for (int stream = 0; stream < 200; ++stream) {
    const int64_t waste_after_ms = 120000;
    const std::vector<Sample> samples = random_stream(random, 20 + static_cast<int>(random() % 500));
    const UtilSummary whole = summary_of(samples, 0, samples.size(), waste_after_ms);
    // split at random points, appended one after the other
    std::vector<size_t> cuts = {0};
    while (cuts.back() < samples.size()) cuts.push_back(std::min(samples.size(), cuts.back() + 1 + random() % 40));
    UtilSummary appended;
    std::vector<UtilSummary> pieces;
    for (size_t i = 1; i < cuts.size(); ++i) pieces.push_back(summary_of(samples, cuts[i - 1], cuts[i], 120000));
    for (const UtilSummary& piece : pieces) appended.append(piece);
    // the same pieces grouped the other way: (a (b (c ...)))
    UtilSummary right;
    for (auto it = pieces.rbegin(); it != pieces.rend(); ++it) {
      UtilSummary left = *it;
      left.append(right);
      right = left;
    }
    for (const UtilSummary* composed : {&appended, &right}) {
      const std::string where = "stream " + std::to_string(stream);
      EXPECT_EQ(composed->samples, whole.samples) << where;
      EXPECT_EQ(composed->first_ts_ms, whole.first_ts_ms) << where;
      EXPECT_EQ(composed->last_ts_ms, whole.last_ts_ms) << where;
      EXPECT_EQ(composed->last_util, whole.last_util) << where;
      EXPECT_EQ(composed->util_micro_ms, whole.util_micro_ms) << where;
      EXPECT_EQ(composed->covered_ms, whole.covered_ms) << where;
      EXPECT_EQ(composed->low_held_ms, whole.low_held_ms) << where;
      EXPECT_EQ(composed->head_low_end_ms, whole.head_low_end_ms) << where;
      EXPECT_EQ(composed->tail_low_since_ms, whole.tail_low_since_ms) << where;
      EXPECT_EQ(composed->wasted_ms, whole.wasted_ms) << where;
      EXPECT_EQ(composed->longest_low_ms, whole.longest_low_ms) << where;
      EXPECT_EQ(composed->closed_runs, whole.closed_runs) << where;
    }
    // what a reader does: the older part as summaries, the rest as samples
    const size_t kept = cuts[cuts.size() / 2];
    UtilTracker direct(kThreshold, waste_after_ms), mixed(kThreshold, waste_after_ms);
    for (const Sample& sample : samples) direct.observe(3, sample.ts_ms, sample.util);
    for (size_t i = 0; i + 1 < cuts.size() && cuts[i] < kept; ++i) mixed.observe_summary(3, pieces[i]);
    for (size_t i = kept; i < samples.size(); ++i) mixed.observe(3, samples[i].ts_ms, samples[i].util);
    if (direct.find(3) == nullptr) continue;  // every sample without a utilisation
    ASSERT_NE(mixed.find(3), nullptr);
    expect_same(*mixed.find(3), *direct.find(3), "mixed stream " + std::to_string(stream));
  }
}

TEST(QuotaUtilSummary, ALowRunAcrossHoursIsOneRunCountedOnce) {
  const int64_t minute = 60000;
  // low from 00:50 to 02:10 (80 minutes) through a whole low hour, between busy samples
  std::vector<Sample> samples;
  for (int64_t t = 0; t <= 200; t += 10) {
    const bool low = t >= 50 && t < 130;
    samples.push_back({kStart + t * minute, low ? 0.1 : 0.9});
  }
  const std::vector<UtilSummary> hours = hours_of(samples, 30 * minute);
  ASSERT_EQ(hours.size(), 4u);
  EXPECT_TRUE(hours[1].all_low());
  EXPECT_EQ(hours[0].tail_low_since_ms, kStart + 50 * minute);
  EXPECT_EQ(hours[2].head_low_end_ms, kStart + 130 * minute);
  UtilTracker tracker(kThreshold, 30 * minute);
  for (const UtilSummary& hour : hours) tracker.observe_summary(5, hour);
  const LeaseUtil& util = *tracker.find(5);
  EXPECT_EQ(util.wasted_ms, 80 * minute);
  EXPECT_EQ(util.longest_low_ms, 80 * minute);
  EXPECT_EQ(util.low_held_ms, 80 * minute);
  EXPECT_EQ(util.low_since_ms, -1);
  EXPECT_EQ(util.covered_ms, 200 * minute);
  EXPECT_EQ(util.util_micro_ms, (120 * 900000 + 80 * 100000) * minute);
}

TEST(QuotaUtilSummary, ASampleEarlierThanTheLastOrWithoutUtilisationIsIgnored) {
  UtilSummary summary;
  summary.threshold = kThreshold;
  summary.add(kStart + 1000, 0.5);
  summary.add(kStart + 500, 0.1);
  summary.add(kStart + 2000, -1);
  EXPECT_EQ(summary.samples, 1);
  EXPECT_EQ(summary.last_ts_ms, kStart + 1000);
  UtilTracker tracker(kThreshold, 1000);
  tracker.observe(9, kStart + 5000, 0.5);
  tracker.observe_summary(9, summary);  // older than what the tracker holds
  EXPECT_EQ(tracker.find(9)->samples, 1);
  EXPECT_EQ(tracker.find(9)->first_ts_ms, kStart + 5000);
}

}  // namespace
}  // namespace yolo8::quota
