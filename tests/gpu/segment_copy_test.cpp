// The host segment copier: every byte of many odd segments lands, nothing else is touched, empty
// batches and segments are fine, bad segments are refused before anything is copied, and the
// CUDA-only calls (events) answer kInvalid.
#include "kvnode/gpu/segment_copy.hpp"

#include <gtest/gtest.h>

#include <vector>

#include "gpu/segment_plan.hpp"

namespace kvnode::gpu {
namespace {

TEST(SegmentCopy, HostCopierCopiesEveryByteOfOddSegments) {
  const test::SegmentPlan plan = test::plan_segments(600, 7);
  const std::vector<std::byte> src = test::pattern(plan.src_bytes, 1);
  const std::vector<std::byte> initial = test::pattern(plan.dst_bytes, 2);
  std::vector<std::byte> dst = initial;
  const auto copier = make_host_segment_copier();
  EXPECT_FALSE(copier->on_device());
  EXPECT_STREQ(copier->name(), "memcpy");
  ASSERT_TRUE(copier->copy(test::bind(plan, src.data(), dst.data())));
  ASSERT_TRUE(copier->synchronize());
  EXPECT_TRUE(dst == test::expected(plan, src, initial));  // gaps between segments untouched
}

TEST(SegmentCopy, EmptyBatchesAndSegmentsCopyNothing) {
  const auto copier = make_host_segment_copier();
  EXPECT_TRUE(copier->copy({}));
  const std::vector<CopySegment> empty{{nullptr, nullptr, 0}};
  EXPECT_TRUE(copier->copy(empty));
  EXPECT_TRUE(copier->synchronize());
}

TEST(SegmentCopy, ANullSegmentIsRefusedBeforeAnythingIsCopied) {
  std::vector<std::byte> a(64, std::byte{1}), b(64, std::byte{0});
  const std::vector<CopySegment> segments{{a.data(), b.data(), 8}, {nullptr, b.data() + 8, 8}};
  const auto copier = make_host_segment_copier();
  const Status s = copier->copy(segments);
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().code, ErrorCode::kInvalid);
  EXPECT_NE(s.error().message.find("segment 1"), std::string::npos) << s.error().message;
  EXPECT_EQ(b, std::vector<std::byte>(64, std::byte{0}));
}

TEST(SegmentCopy, HostCopierHasNoEvents) {
  const auto copier = make_host_segment_copier();
  const IpcHandle handle{};
  const Status wait = copier->wait(handle);
  ASSERT_FALSE(wait);
  EXPECT_EQ(wait.error().code, ErrorCode::kInvalid);
  const Status record = copier->record(handle);
  ASSERT_FALSE(record);
  EXPECT_EQ(record.error().code, ErrorCode::kInvalid);
}

}  // namespace
}  // namespace kvnode::gpu
