#include "checkpoint/checkpoint_config.h"

#include <cstdlib>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace plait::checkpoint {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::Field;
using ::testing::IsEmpty;

// Matches a violation of the config's own checks (no rule).
auto Violation(const std::string& field, const std::string& message) {
  return AllOf(Field(&base::Violation::field, field), Field(&base::Violation::message, message),
               Field(&base::Violation::rule, ""));
}

TEST(CheckConfigTest, NoCheckpointsAndAFolderToCreateAreValid) {
  EXPECT_THAT(CheckConfig(CheckpointConfig(), "run.checkpoint"), IsEmpty());
  CheckpointConfig config;
  config.set_dir(std::string(std::getenv("TEST_TMPDIR")) + "/not/yet/there");
  config.set_every(5);
  config.set_keep_last(2);
  config.set_resume(true);
  EXPECT_THAT(CheckConfig(config, "run.checkpoint"), IsEmpty());
  config.set_dir("relative/folder");
  EXPECT_THAT(CheckConfig(config, "run.checkpoint"), IsEmpty());
}

TEST(CheckConfigTest, NegativeValuesAndAFolderUnderAFileNameTheirFields) {
  CheckpointConfig config;
  config.set_dir("/dev/null/plait/ckpt");
  config.set_every(-5);
  config.set_keep_last(-1);
  EXPECT_THAT(
      CheckConfig(config, "run.checkpoint"),
      ElementsAre(Violation("run.checkpoint.every", "-5; must be >= 0"),
                  Violation("run.checkpoint.keep_last", "-1; must be >= 0"),
                  Violation("run.checkpoint.dir",
                            "\"/dev/null/plait/ckpt\" cannot be created: \"/dev/null\" is not a "
                            "folder")));
}

TEST(CheckConfigTest, OtherFieldsWithoutADirAreAnError) {
  CheckpointConfig config;
  config.set_resume(true);
  EXPECT_THAT(CheckConfig(config, "run.checkpoint"),
              ElementsAre(Violation("run.checkpoint.dir",
                                    "is empty, but other checkpoint fields are set; name a "
                                    "folder")));
}

}  // namespace
}  // namespace plait::checkpoint
