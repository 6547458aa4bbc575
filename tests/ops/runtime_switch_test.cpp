// RuntimeSwitch / RuntimeSetting / ScopedSwitch: the CUDA backend's run-time switches. The class
// is host-only and header-only, so this runs in the CPU build as well.
#include "ops/cuda/runtime_switch.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <stdexcept>
#include <string>

#include "core/error.h"

namespace deepinfer::cuda {
namespace {

// Each test reads its own objects: the environment is read once per object and process, so a
// test that shared one with another would depend on the order they run in.
RuntimeSwitch on_by_default{"DEEPINFER_TEST_SWITCH_ON_BY_DEFAULT", true};
RuntimeSwitch off_by_default{"DEEPINFER_TEST_SWITCH_OFF_BY_DEFAULT", false};
RuntimeSwitch read_once{"DEEPINFER_TEST_SWITCH_READ_ONCE", true};
RuntimeSwitch bad_value{"DEEPINFER_TEST_SWITCH_BAD_VALUE", true};
RuntimeSwitch override_over_environment{"DEEPINFER_TEST_SWITCH_OVERRIDE", true};
RuntimeSwitch restored{"DEEPINFER_TEST_SWITCH_RESTORED", true};
RuntimeSetting mode{"DEEPINFER_TEST_SETTING_MODE", 2, 0, 1};
RuntimeSetting bad_mode{"DEEPINFER_TEST_SETTING_BAD_MODE", 0, 0, 7};

// The message of the Error `call` throws ("" when it throws none).
template <typename Call>
std::string error_message(Call call) {
  try {
    call();
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

TEST(RuntimeSwitchTest, CompiledDefaultWithoutEnvironment) {
  unsetenv("DEEPINFER_TEST_SWITCH_ON_BY_DEFAULT");
  unsetenv("DEEPINFER_TEST_SWITCH_OFF_BY_DEFAULT");
  EXPECT_TRUE(on_by_default.enabled());
  EXPECT_FALSE(off_by_default.enabled());
  EXPECT_STREQ(on_by_default.name(), "DEEPINFER_TEST_SWITCH_ON_BY_DEFAULT");
}

TEST(RuntimeSwitchTest, EnvironmentIsReadOnce) {
  setenv("DEEPINFER_TEST_SWITCH_READ_ONCE", "0", 1);
  EXPECT_FALSE(read_once.enabled());
  // A later change is not seen: the value is fixed for the process at the first use.
  setenv("DEEPINFER_TEST_SWITCH_READ_ONCE", "1", 1);
  EXPECT_FALSE(read_once.enabled());
  unsetenv("DEEPINFER_TEST_SWITCH_READ_ONCE");
  EXPECT_FALSE(read_once.enabled());
}

TEST(RuntimeSwitchTest, BadEnvironmentValueNamesVariableAndValue) {
  setenv("DEEPINFER_TEST_SWITCH_BAD_VALUE", "yes", 1);
  const std::string message = error_message([] { (void)bad_value.enabled(); });
  EXPECT_NE(message.find("DEEPINFER_TEST_SWITCH_BAD_VALUE"), std::string::npos) << message;
  EXPECT_NE(message.find("yes"), std::string::npos) << message;
  // Still an error on the next use (a bad value is never taken for the default).
  EXPECT_THROW((void)bad_value.enabled(), Error);
  for (const char* bad : {"", "2", "-1", "01x", "true", " 1"}) {
    setenv("DEEPINFER_TEST_SWITCH_BAD_VALUE", bad, 1);
    EXPECT_THROW((void)bad_value.enabled(), Error) << "\"" << bad << "\"";
  }
  // The override does not read the environment.
  {
    const ScopedSwitch off("DEEPINFER_TEST_SWITCH_BAD_VALUE", false);
    EXPECT_FALSE(bad_value.enabled());
  }
  setenv("DEEPINFER_TEST_SWITCH_BAD_VALUE", "1", 1);
  EXPECT_TRUE(bad_value.enabled());
  unsetenv("DEEPINFER_TEST_SWITCH_BAD_VALUE");
}

TEST(RuntimeSwitchTest, OverrideWinsOverEnvironmentAndRestores) {
  setenv("DEEPINFER_TEST_SWITCH_OVERRIDE", "0", 1);
  EXPECT_FALSE(override_over_environment.enabled());
  {
    const ScopedSwitch on("DEEPINFER_TEST_SWITCH_OVERRIDE", true);
    EXPECT_TRUE(override_over_environment.enabled());
    {
      const ScopedSwitch off("DEEPINFER_TEST_SWITCH_OVERRIDE", false);
      EXPECT_FALSE(override_over_environment.enabled());
    }
    EXPECT_TRUE(override_over_environment.enabled());  // the outer override again
  }
  EXPECT_FALSE(override_over_environment.enabled());  // the environment's value again
  unsetenv("DEEPINFER_TEST_SWITCH_OVERRIDE");
}

TEST(RuntimeSwitchTest, OverrideRestoredWhenScopeThrows) {
  unsetenv("DEEPINFER_TEST_SWITCH_RESTORED");
  EXPECT_TRUE(restored.enabled());
  EXPECT_THROW(
      {
        const ScopedSwitch off("DEEPINFER_TEST_SWITCH_RESTORED", false);
        EXPECT_FALSE(restored.enabled());
        throw std::runtime_error("unwinds the scope");
      },
      std::runtime_error);
  EXPECT_TRUE(restored.enabled());
}

TEST(RuntimeSwitchTest, UnknownNameThrows) {
  const std::string message =
      error_message([] { const ScopedSwitch off("DEEPINFER_TEST_NO_SUCH_SWITCH", false); });
  EXPECT_NE(message.find("DEEPINFER_TEST_NO_SUCH_SWITCH"), std::string::npos) << message;
  EXPECT_THROW(ScopedSetting("DEEPINFER_TEST_NO_SUCH_SETTING", 0), Error);
  EXPECT_THROW(RuntimeSetting::find("DEEPINFER_TEST_NO_SUCH_SETTING"), Error);
  EXPECT_EQ(&RuntimeSetting::find("DEEPINFER_TEST_SWITCH_RESTORED"), &restored);
}

TEST(RuntimeSettingTest, DefaultOutsideRangeOverrideAndErrors) {
  unsetenv("DEEPINFER_TEST_SETTING_MODE");
  EXPECT_EQ(mode.value(), 2);  // unset: the default, which the environment cannot choose
  {
    const ScopedSetting forced("DEEPINFER_TEST_SETTING_MODE", 1);
    EXPECT_EQ(mode.value(), 1);
  }
  EXPECT_EQ(mode.value(), 2);
  EXPECT_THROW(ScopedSetting("DEEPINFER_TEST_SETTING_MODE", 2), Error);  // outside [0, 1]
  // A switch's test API takes only switches.
  EXPECT_THROW(ScopedSwitch("DEEPINFER_TEST_SETTING_MODE", true), Error);

  setenv("DEEPINFER_TEST_SETTING_BAD_MODE", "8", 1);
  const std::string message = error_message([] { (void)bad_mode.value(); });
  EXPECT_NE(message.find("DEEPINFER_TEST_SETTING_BAD_MODE"), std::string::npos) << message;
  EXPECT_NE(message.find("\"8\""), std::string::npos) << message;
  setenv("DEEPINFER_TEST_SETTING_BAD_MODE", "5", 1);
  EXPECT_EQ(bad_mode.value(), 5);
  unsetenv("DEEPINFER_TEST_SETTING_BAD_MODE");
}

}  // namespace
}  // namespace deepinfer::cuda
