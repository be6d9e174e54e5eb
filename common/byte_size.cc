// ParseByteSize (see byte_size.h). Hand-written on std::from_chars: CLI11's
// AsSizeValue knows the same units, but it is a flag transformer that throws
// and yields a string, and the TOML loader should not need the CLI library.
#include "common/byte_size.h"

#include <fmt/format.h>

#include <charconv>
#include <string>
#include <utility>

namespace tierkv {
namespace {

constexpr std::string_view kExamples = "e.g. 64MiB, 1 GiB or 4096";

bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' ||
         c == '\v';
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && IsSpace(s.front())) s.remove_prefix(1);
  while (!s.empty() && IsSpace(s.back())) s.remove_suffix(1);
  return s;
}

char Lower(char c) {
  return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c;
}

bool EqualsIgnoringCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (Lower(a[i]) != Lower(b[i])) return false;
  }
  return true;
}

// log2 of the multiplier of `unit` (see the grammar in byte_size.h); -1 for
// an unknown unit.
int UnitShift(std::string_view unit) {
  static constexpr std::pair<std::string_view, int> kUnits[] = {
      {"", 0},     {"b", 0},    {"kib", 10}, {"k", 10},   {"kb", 10},
      {"mib", 20}, {"m", 20},   {"mb", 20},  {"gib", 30}, {"g", 30},
      {"gb", 30},  {"tib", 40}, {"t", 40},   {"tb", 40}};
  for (const auto& [name, shift] : kUnits) {
    if (EqualsIgnoringCase(unit, name)) return shift;
  }
  return -1;
}

}  // namespace

Result<uint64_t> ParseByteSize(std::string_view text) {
  const std::string_view s = Trim(text);
  if (s.empty()) {
    return Status::InvalidArgument(
        fmt::format("empty size \"{}\" ({})", text, kExamples));
  }
  uint64_t value = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec == std::errc::invalid_argument) {  // also a sign: there is none
    return Status::InvalidArgument(fmt::format(
        "\"{}\" is not a size: it must start with a whole number of bytes "
        "({})",
        text, kExamples));
  }
  if (ec == std::errc::result_out_of_range) {
    return Status::InvalidArgument(
        fmt::format("\"{}\" is more than 2^64 - 1 bytes", text));
  }
  const std::string_view rest = s.substr(static_cast<size_t>(end - s.data()));
  if (!rest.empty() && rest.front() == '.') {
    return Status::InvalidArgument(fmt::format(
        "\"{}\" is not a whole number of bytes: write a smaller unit "
        "(1536MiB, not 1.5GiB)",
        text));
  }
  const std::string_view unit = Trim(rest);
  const int shift = UnitShift(unit);
  if (shift < 0) {
    return Status::InvalidArgument(fmt::format(
        "\"{}\": unknown unit \"{}\" (B, KiB, MiB, GiB, TiB; K, M, G, T and "
        "KB, MB, GB, TB are binary too)",
        text, unit));
  }
  if (value > (UINT64_MAX >> shift)) {
    return Status::InvalidArgument(
        fmt::format("\"{}\" is more than 2^64 - 1 bytes", text));
  }
  return value << shift;
}

}  // namespace tierkv
