// Implements the value types of tierkv/types.h.
#include "tierkv/types.h"

#include <fmt/format.h>
#define XXH_INLINE_ALL  // header-only: lets the compiler inline XXH3
#include <xxhash.h>

#include <charconv>
#include <set>

namespace tierkv {

std::string PageHash::ToHex() const {
  return fmt::format("{:016x}{:016x}", hi, lo);
}

Result<PageHash> PageHash::FromHex(std::string_view hex) {
  if (hex.size() != 32) {
    return Status::InvalidArgument("page hash must be 32 hex digits");
  }
  PageHash h;
  auto parse = [](std::string_view s, uint64_t& out) {
    auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), out, 16);
    return ec == std::errc() && ptr == s.data() + s.size();
  };
  if (!parse(hex.substr(0, 16), h.hi) || !parse(hex.substr(16), h.lo)) {
    return Status::InvalidArgument("page hash is not hexadecimal");
  }
  return h;
}

std::string SegmentKey::ToString() const {
  return fmt::format("{}/{}/{}", page.ToHex(), layer, part);
}

LayoutSpec LayoutSpec::Uniform(uint32_t page_tokens, uint32_t num_layers,
                               std::vector<PartSpec> parts) {
  LayoutSpec spec;
  spec.page_tokens = page_tokens;
  spec.layers.assign(num_layers, LayerSpec{std::move(parts)});
  return spec;
}

Status LayoutSpec::Validate() const {
  constexpr uint64_t kMaxSegmentBytes = uint64_t{1} << 30;
  if (page_tokens == 0 || page_tokens > 65536) {
    return Status::InvalidArgument("page_tokens must be in [1, 65536]");
  }
  if (layers.empty() || layers.size() > 65535) {
    return Status::InvalidArgument("a layout needs 1..65535 layers");
  }
  for (size_t l = 0; l < layers.size(); ++l) {
    const auto& parts = layers[l].parts;
    if (parts.empty() || parts.size() > 255) {
      return Status::InvalidArgument(
          fmt::format("layer {} needs 1..255 parts", l));
    }
    std::set<std::string_view> names;
    for (const auto& p : parts) {
      if (p.name.empty() || p.name.size() > 64) {
        return Status::InvalidArgument(
            fmt::format("layer {}: part names need 1..64 characters", l));
      }
      if (!names.insert(p.name).second) {
        return Status::InvalidArgument(
            fmt::format("layer {}: duplicate part '{}'", l, p.name));
      }
      if (p.bytes_per_token == 0 || p.bytes_per_token > (1u << 20)) {
        return Status::InvalidArgument(fmt::format(
            "layer {} part '{}': bytes_per_token must be in [1, 1 MiB]", l,
            p.name));
      }
      if (uint64_t{p.bytes_per_token} * page_tokens > kMaxSegmentBytes) {
        return Status::InvalidArgument(fmt::format(
            "layer {} part '{}': segment larger than 1 GiB", l, p.name));
      }
    }
  }
  return Status::OK();
}

uint64_t LayoutSpec::SegmentBytes(uint16_t layer, uint8_t part) const {
  if (layer >= layers.size() || part >= layers[layer].parts.size()) return 0;
  return uint64_t{layers[layer].parts[part].bytes_per_token} * page_tokens;
}

int LayoutSpec::FindPart(uint16_t layer, std::string_view name) const {
  if (layer >= layers.size()) return -1;
  const auto& parts = layers[layer].parts;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (parts[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

uint64_t LayoutSpec::Fingerprint() const {
  XXH3_state_t state;
  XXH3_64bits_reset(&state);
  XXH3_64bits_update(&state, &page_tokens, sizeof(page_tokens));
  for (const auto& layer : layers) {
    const uint32_t n = static_cast<uint32_t>(layer.parts.size());
    XXH3_64bits_update(&state, &n, sizeof(n));
    for (const auto& p : layer.parts) {
      const uint32_t len = static_cast<uint32_t>(p.name.size());
      XXH3_64bits_update(&state, &len, sizeof(len));
      XXH3_64bits_update(&state, p.name.data(), p.name.size());
      XXH3_64bits_update(&state, &p.bytes_per_token, sizeof(p.bytes_per_token));
    }
  }
  return XXH3_64bits_digest(&state);
}

}  // namespace tierkv
