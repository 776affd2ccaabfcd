#include "base/crc32c.h"

#include <string>

#include "gtest/gtest.h"

namespace plait::base {
namespace {

TEST(Crc32cTest, MatchesTheVectorsOfRfc3720) {
  EXPECT_EQ(Crc32c(""), 0x00000000u);
  EXPECT_EQ(Crc32c("123456789"), 0xE3069283u);
  // RFC 3720, appendix B.4.
  EXPECT_EQ(Crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(Crc32c(std::string(32, '\xFF')), 0x62A8AB43u);
  std::string ascending, descending;
  for (int i = 0; i < 32; ++i) {
    ascending.push_back(static_cast<char>(i));
    descending.push_back(static_cast<char>(31 - i));
  }
  EXPECT_EQ(Crc32c(ascending), 0x46DD794Eu);
  EXPECT_EQ(Crc32c(descending), 0x113FDB5Cu);
}

// The values of tensorboard.compat.tensorflow_stub.pywrap_tensorflow.masked_crc32c.
TEST(Crc32cTest, MasksAsTensorBoard) {
  EXPECT_EQ(MaskedCrc32c(""), 0xA282EAD8u);
  EXPECT_EQ(MaskedCrc32c("123456789"), 0xC78AB0E5u);
}

}  // namespace
}  // namespace plait::base
