// DeviceUuid (see device_uuid.h).
#include "storage/device/device_uuid.h"

#include <fmt/format.h>

#include <algorithm>

namespace tierkv::storage {

bool IsUnsetDeviceUuid(const DeviceUuid& uuid) {
  return std::all_of(uuid.begin(), uuid.end(),
                     [](std::byte b) { return b == std::byte{0}; });
}

std::string FormatDeviceUuid(const DeviceUuid& uuid) {
  std::string out = "GPU-";
  for (size_t i = 0; i < uuid.size(); ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    out += fmt::format("{:02x}", static_cast<unsigned>(uuid[i]));
  }
  return out;
}

Result<DeviceUuid> ParseDeviceUuid(std::string_view text) {
  const std::string_view original = text;
  if (text.substr(0, 4) == "GPU-") text.remove_prefix(4);
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  // 8-4-4-4-12 hex digits: dashes at 8, 13, 18 and 23, nowhere else.
  std::string hex;
  bool ok = text.size() == 36;
  for (size_t i = 0; ok && i < text.size(); ++i) {
    const bool dash_here = i == 8 || i == 13 || i == 18 || i == 23;
    ok = dash_here ? text[i] == '-' : nibble(text[i]) >= 0;
    if (!dash_here) hex += text[i];
  }
  if (!ok) {
    return Status::InvalidArgument(fmt::format(
        "'{}' is not a GPU UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx, as "
        "`nvidia-smi -L` prints)",
        original));
  }
  DeviceUuid uuid{};
  for (size_t i = 0; i < uuid.size(); ++i) {
    uuid[i] = static_cast<std::byte>(nibble(hex[2 * i]) * 16 +
                                     nibble(hex[2 * i + 1]));
  }
  return uuid;
}

DeviceUuid EmulatedDeviceUuid(int ordinal) {
  DeviceUuid uuid;
  uuid.fill(std::byte{0xee});
  uuid[14] = static_cast<std::byte>((ordinal >> 8) & 0xff);
  uuid[15] = static_cast<std::byte>(ordinal & 0xff);
  return uuid;
}

int EmulatedDeviceOrdinal(const DeviceUuid& uuid) {
  for (size_t i = 0; i < 14; ++i) {
    if (uuid[i] != std::byte{0xee}) return -1;
  }
  return (static_cast<int>(uuid[14]) << 8) | static_cast<int>(uuid[15]);
}

}  // namespace tierkv::storage
