// Reads Mooncake-format prefix traces (see prefix_trace.h).
#include "tools/prefix_trace.h"

#include <fmt/format.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "tools/prefix_hit_rules.h"

namespace tierkv::tools {
namespace {

using nlohmann::json;

// The value of `key` as a non-negative integer, or why not.
Result<uint64_t> ReadCount(const json& object, const char* key) {
  auto it = object.find(key);
  if (it == object.end()) {
    return Status::InvalidArgument(fmt::format("missing \"{}\"", key));
  }
  // The parser stores every non-negative integer as unsigned.
  if (!it->is_number_unsigned()) {
    return Status::InvalidArgument(fmt::format(
        "\"{}\" must be a non-negative integer, not {}", key, it->dump()));
  }
  return it->get<uint64_t>();
}

Result<TraceRequest> ParseRequest(const json& line) {
  if (!line.is_object()) {
    return Status::InvalidArgument("not a JSON object");
  }
  TraceRequest request;
  auto timestamp = ReadCount(line, "timestamp");
  if (!timestamp.ok()) return timestamp.status();
  request.timestamp_ms = *timestamp;
  auto input = ReadCount(line, "input_length");
  if (!input.ok()) return input.status();
  if (*input == 0) {
    return Status::InvalidArgument("\"input_length\" must be at least 1");
  }
  request.input_length = *input;
  if (line.contains("output_length")) {
    auto output = ReadCount(line, "output_length");
    if (!output.ok()) return output.status();
    request.output_length = *output;
  }
  auto ids = line.find("hash_ids");
  if (ids == line.end()) return Status::InvalidArgument("missing \"hash_ids\"");
  if (!ids->is_array()) {
    return Status::InvalidArgument("\"hash_ids\" must be an array");
  }
  request.hash_ids.reserve(ids->size());
  for (size_t i = 0; i < ids->size(); ++i) {
    const json& id = (*ids)[i];
    if (!id.is_number_unsigned()) {
      return Status::InvalidArgument(
          fmt::format("\"hash_ids\"[{}] must be a non-negative integer, not {}",
                      i, id.dump()));
    }
    request.hash_ids.push_back(id.get<uint64_t>());
  }
  const uint64_t cacheable = CacheableBlockCount(request.input_length);
  if (request.hash_ids.size() < cacheable) {
    return Status::InvalidArgument(fmt::format(
        "\"hash_ids\" has {} ids, but \"input_length\" {} needs at least {} "
        "({}-token blocks)",
        request.hash_ids.size(), request.input_length, cacheable,
        kTraceBlockTokens));
  }
  return request;
}

}  // namespace

Result<std::vector<TraceRequest>> ParsePrefixTrace(std::istream& in,
                                                   std::string_view name) {
  std::vector<TraceRequest> requests;
  std::string text;
  for (uint64_t line_number = 1; std::getline(in, text); ++line_number) {
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto where = [&](std::string_view why) {
      return Status::InvalidArgument(
          fmt::format("{}:{}: {}", name, line_number, why));
    };
    // nlohmann::json reports syntax errors only as exceptions; the message
    // names the column, which is worth the try.
    json line;
    try {
      line = json::parse(text);
    } catch (const json::parse_error& e) {
      return where(fmt::format("not valid JSON ({})", e.what()));
    }
    auto request = ParseRequest(line);
    if (!request.ok()) return where(request.status().message());
    requests.push_back(std::move(request).value());
  }
  if (in.bad()) return Status::IOError(fmt::format("{}: read failed", name));
  if (requests.empty()) {
    return Status::InvalidArgument(fmt::format("{}: no requests", name));
  }
  return requests;
}

Result<std::vector<TraceRequest>> LoadPrefixTrace(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status::NotFound("cannot open trace " + path);
  return ParsePrefixTrace(in, path);
}

}  // namespace tierkv::tools
