#include "core/logging.h"

#include <gtest/gtest.h>

namespace deepinfer {

TEST(Logging, ParsesEveryLevelName) {
  EXPECT_EQ(parse_log_level("trace"), LogLevel::kTrace);
  EXPECT_EQ(parse_log_level("warn"), LogLevel::kWarn);
  EXPECT_EQ(parse_log_level("off"), LogLevel::kOff);
}

TEST(Logging, RejectsUnknownLevelWithTheAcceptedNames) {
  try {
    parse_log_level("verbose");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("verbose"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("trace, debug"), std::string::npos);
  }
}

}  // namespace deepinfer
