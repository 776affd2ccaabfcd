#include "metrics/record_file.h"

#include <string>

#include "absl/strings/escaping.h"
#include "base/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace plait::metrics {
namespace {

using ::plait::base::testing::IsOk;
using ::plait::base::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Event { wall_time: 1.5 step: 3 summary { value { tag: "loss" simple_value: 2.5 } } }
// serialized, and the record tensorboard.summary.writer.record_writer.RecordWriter (2.21.0)
// wrote for it.
const std::string kEvent = absl::HexStringToBytes(
    "09000000000000f83f10032a0d0a0b0a046c6f737315000020"
    "40");
const std::string kTensorBoardRecord = absl::HexStringToBytes(
    "1a00000000000000129bd82d09000000000000f83f10032a0d0a0b0a046c6f7373150000204081c510f9");

TEST(RecordFileTest, FramesARecordAsTensorBoardWritesIt) {
  EXPECT_EQ(absl::BytesToHexString(FrameRecord(kEvent)),
            absl::BytesToHexString(kTensorBoardRecord));
}

TEST(RecordFileTest, ReadsBackEveryRecord) {
  const std::string bytes = FrameRecord("first") + FrameRecord("") + FrameRecord(kEvent);
  absl::StatusOr<Records> records = ParseRecords(bytes, "events");
  ASSERT_THAT(records, IsOk());
  EXPECT_THAT(records->records, ElementsAre("first", "", kEvent));
  EXPECT_EQ(records->cut_short_bytes, 0);
}

// A killed run leaves a record cut anywhere: the full ones before it still read.
TEST(RecordFileTest, AFileCutShortReadsUpToItsLastFullRecord) {
  const std::string first = FrameRecord("first");
  const std::string bytes = first + FrameRecord(kEvent);
  for (size_t size = first.size(); size < bytes.size(); ++size) {
    absl::StatusOr<Records> records = ParseRecords(bytes.substr(0, size), "events");
    ASSERT_THAT(records, IsOk()) << size;
    EXPECT_THAT(records->records, ElementsAre("first")) << size;
    EXPECT_EQ(records->cut_short_bytes, size - first.size());
  }
}

TEST(RecordFileTest, AChangedByteIsDataLossNamingTheRecord) {
  const std::string first = FrameRecord("first");
  std::string bytes = first + FrameRecord(kEvent);
  bytes[first.size() + 20] ^= 1;  // in the event's data
  EXPECT_THAT(ParseRecords(bytes, "events"),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("events: record 1 at byte 21: the CRC of its data")));
  bytes = first + FrameRecord(kEvent);
  bytes[first.size() + 1] ^= 1;  // in its length
  EXPECT_THAT(ParseRecords(bytes, "events"),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("the CRC of its length")));
}

}  // namespace
}  // namespace plait::metrics
