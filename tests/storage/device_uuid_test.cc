// DeviceUuid: nvidia-smi's text form both ways, and the emulated devices'.
#include "storage/device/device_uuid.h"

#include <gtest/gtest.h>

#include "tests/testing/status_matchers.h"

namespace tierkv::storage {
namespace {

TEST(DeviceUuidTest, NvidiaSmiTextRoundTrips) {
  const char* text = "GPU-5c3f1a2b-0d4e-6f70-8192-a3b4c5d6e7f8";
  auto uuid = ParseDeviceUuid(text);
  ASSERT_OK(uuid);
  EXPECT_EQ((*uuid)[0], std::byte{0x5c});
  EXPECT_EQ((*uuid)[15], std::byte{0xf8});
  EXPECT_EQ(FormatDeviceUuid(*uuid), text);
  // The prefix is optional and hex may be upper case.
  auto bare = ParseDeviceUuid("5C3F1A2B-0D4E-6F70-8192-A3B4C5D6E7F8");
  ASSERT_OK(bare);
  EXPECT_EQ(*bare, *uuid);
  EXPECT_FALSE(IsUnsetDeviceUuid(*uuid));
  EXPECT_TRUE(IsUnsetDeviceUuid(DeviceUuid{}));
}

TEST(DeviceUuidTest, MalformedTextIsRefusedWithTheExpectedForm) {
  for (const char* bad : {"", "GPU-", "GPU-5c3f1a2b0d4e6f708192a3b4c5d6e7f8",
                          "GPU-5c3f1a2b-0d4e-6f70-8192-a3b4c5d6e7f",
                          "GPU-5c3f1a2b-0d4e-6f70-8192-a3b4c5d6e7f8a",
                          "GPU-5c3f1a2b-0d4e-6f70-8192-a3b4c5d6e7g8",
                          "MIG-5c3f1a2b-0d4e-6f70-8192-a3b4c5d6e7f8"}) {
    auto uuid = ParseDeviceUuid(bad);
    ASSERT_FALSE(uuid.ok()) << bad;
    EXPECT_NE(uuid.status().message().find("nvidia-smi"), std::string::npos);
  }
}

TEST(DeviceUuidTest, EmulatedDevicesHaveStableDistinctUuids) {
  EXPECT_EQ(EmulatedDeviceOrdinal(EmulatedDeviceUuid(0)), 0);
  EXPECT_EQ(EmulatedDeviceOrdinal(EmulatedDeviceUuid(7)), 7);
  EXPECT_NE(EmulatedDeviceUuid(0), EmulatedDeviceUuid(1));
  EXPECT_EQ(FormatDeviceUuid(EmulatedDeviceUuid(1)),
            "GPU-eeeeeeee-eeee-eeee-eeee-eeeeeeee0001");
  auto real = ParseDeviceUuid("GPU-5c3f1a2b-0d4e-6f70-8192-a3b4c5d6e7f8");
  ASSERT_OK(real);
  EXPECT_EQ(EmulatedDeviceOrdinal(*real), -1);
}

}  // namespace
}  // namespace tierkv::storage
