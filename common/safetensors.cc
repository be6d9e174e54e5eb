// Safetensors reader (mmap) and writer (see safetensors.h).
#include "common/safetensors.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <tuple>
#include <utility>

namespace tierkv {

// A read-only mapping of a whole file; unmapped on destruction.
class MappedFile {
 public:
  static Result<std::unique_ptr<MappedFile>> Open(
      const std::filesystem::path& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      return Status::IOError(fmt::format("cannot open {}: {}", path.string(),
                                         std::strerror(errno)));
    }
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      const int err = errno;
      ::close(fd);
      return Status::IOError(
          fmt::format("cannot stat {}: {}", path.string(), std::strerror(err)));
    }
    auto file = std::unique_ptr<MappedFile>(new MappedFile());
    file->path_ = path.string();
    file->size_ = static_cast<size_t>(st.st_size);
    if (file->size_ > 0) {
      void* p = ::mmap(nullptr, file->size_, PROT_READ, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) {
        const int err = errno;
        ::close(fd);
        return Status::IOError(fmt::format("cannot mmap {}: {}", path.string(),
                                           std::strerror(err)));
      }
      file->data_ = static_cast<const std::byte*>(p);
    }
    ::close(fd);
    return file;
  }
  ~MappedFile() {
    if (data_ != nullptr) {
      ::munmap(const_cast<std::byte*>(data_), size_);
    }
  }
  std::span<const std::byte> bytes() const { return {data_, size_}; }
  const std::string& path() const { return path_; }

 private:
  MappedFile() = default;
  std::string path_;
  const std::byte* data_ = nullptr;
  size_t size_ = 0;
};

namespace {

using nlohmann::json;

Status Corrupt(const std::string& file, std::string_view what) {
  return Status::Corruption(fmt::format("safetensors file {}: {}", file, what));
}

}  // namespace

size_t SafetensorsDTypeSize(std::string_view dtype) {
  // The dtypes of huggingface/safetensors' Dtype enum that have a whole
  // number of bytes per element (F4/F6 pack several per byte: unchecked).
  static constexpr std::pair<std::string_view, size_t> kSizes[] = {
      {"BOOL", 1},    {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1},
      {"F8_E8M0", 1}, {"I16", 2}, {"U16", 2}, {"F16", 2},     {"BF16", 2},
      {"I32", 4},     {"U32", 4}, {"F32", 4}, {"F64", 8},     {"I64", 8},
      {"U64", 8},     {"C64", 8}};
  for (const auto& [name, size] : kSizes) {
    if (name == dtype) return size;
  }
  return 0;
}

SafetensorsReader::~SafetensorsReader() = default;

Status SafetensorsReader::AddFile(const std::filesystem::path& path) {
  auto mapped = MappedFile::Open(path);
  if (!mapped.ok()) return mapped.status();
  std::unique_ptr<MappedFile> file = std::move(mapped).value();
  const std::string& name = file->path();
  const auto bytes = file->bytes();
  if (bytes.size() < 8) {
    return Corrupt(name, fmt::format("is truncated: {} bytes, the header "
                                     "length alone needs 8",
                                     bytes.size()));
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) {
    header_len = (header_len << 8) | static_cast<uint8_t>(bytes[i]);
  }
  if (header_len > bytes.size() - 8) {
    return Corrupt(name, fmt::format("is truncated: header claims {} bytes but "
                                     "the file has {} after the length",
                                     header_len, bytes.size() - 8));
  }
  const auto* hp = reinterpret_cast<const char*>(bytes.data() + 8);
  json header = json::parse(hp, hp + header_len, nullptr,
                            /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) {
    return Corrupt(name, "header is not a JSON object");
  }
  const std::span<const std::byte> data = bytes.subspan(8 + header_len);
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const json& e = it.value();
    TensorView view;
    view.name = it.key();
    view.file = name;
    if (!e.is_object() || !e.contains("dtype") || !e["dtype"].is_string() ||
        !e.contains("shape") || !e["shape"].is_array() ||
        !e.contains("data_offsets") || !e["data_offsets"].is_array() ||
        e["data_offsets"].size() != 2) {
      return Corrupt(name, fmt::format("tensor '{}' has a malformed header "
                                       "entry",
                                       view.name));
    }
    view.dtype = e["dtype"].get<std::string>();
    uint64_t numel = 1;
    for (const auto& d : e["shape"]) {
      if (!d.is_number_unsigned() &&
          !(d.is_number_integer() && d.get<int64_t>() >= 0)) {
        return Corrupt(name,
                       fmt::format("tensor '{}' has a bad shape", view.name));
      }
      view.shape.push_back(d.get<int64_t>());
      numel *= d.get<uint64_t>();
    }
    const auto& off = e["data_offsets"];
    if (!off[0].is_number_unsigned() || !off[1].is_number_unsigned()) {
      return Corrupt(
          name, fmt::format("tensor '{}' has bad data_offsets", view.name));
    }
    const uint64_t begin = off[0].get<uint64_t>();
    const uint64_t end = off[1].get<uint64_t>();
    if (begin > end) {
      return Corrupt(name, fmt::format("tensor '{}' has data_offsets [{}, {}) "
                                       "with begin > end",
                                       view.name, begin, end));
    }
    if (end > data.size()) {
      return Corrupt(name, fmt::format("is truncated: tensor '{}' needs data "
                                       "bytes [{}, {}) but the data section "
                                       "has {} bytes",
                                       view.name, begin, end, data.size()));
    }
    if (const size_t size = SafetensorsDTypeSize(view.dtype); size > 0) {
      if (end - begin != numel * size) {
        return Corrupt(name, fmt::format("tensor '{}' ({} {} elements) has {} "
                                         "bytes, expected {}",
                                         view.name, view.dtype, numel,
                                         end - begin, numel * size));
      }
    }
    view.data = data.subspan(begin, end - begin);
    view.file_index = static_cast<uint32_t>(files_.size());
    view.file_offset = begin;
    if (tensors_.count(view.name)) {
      return Corrupt(name, fmt::format("tensor '{}' appears in more than one "
                                       "file",
                                       view.name));
    }
    tensors_.emplace(view.name, std::move(view));
  }
  files_.push_back(std::move(file));
  return Status::OK();
}

Result<std::unique_ptr<SafetensorsReader>> SafetensorsReader::Open(
    const std::filesystem::path& path) {
  std::unique_ptr<SafetensorsReader> reader(new SafetensorsReader());
  std::error_code ec;
  if (!std::filesystem::is_directory(path, ec)) {
    if (!std::filesystem::exists(path, ec)) {
      return Status::NotFound(fmt::format("{} does not exist", path.string()));
    }
    TIERKV_RETURN_IF_ERROR(reader->AddFile(path));
    return reader;
  }
  const auto index = path / "model.safetensors.index.json";
  std::vector<std::filesystem::path> files;
  if (std::filesystem::exists(index, ec)) {
    std::ifstream in(index);
    std::stringstream ss;
    ss << in.rdbuf();
    json j = json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.contains("weight_map") ||
        !j["weight_map"].is_object()) {
      return Status::Corruption(fmt::format(
          "{}: not valid JSON with a \"weight_map\" object", index.string()));
    }
    std::set<std::string> shards;
    for (const auto& [tensor, shard] : j["weight_map"].items()) {
      if (!shard.is_string()) {
        return Status::Corruption(
            fmt::format("{}: weight_map entry for '{}' is not a file name",
                        index.string(), tensor));
      }
      shards.insert(shard.get<std::string>());
    }
    for (const auto& s : shards) {
      if (!std::filesystem::exists(path / s, ec)) {
        return Status::NotFound(
            fmt::format("shard {} named in {} does not exist",
                        (path / s).string(), index.string()));
      }
      files.push_back(path / s);
    }
    TIERKV_RETURN_IF_ERROR([&]() -> Status {
      for (const auto& f : files) TIERKV_RETURN_IF_ERROR(reader->AddFile(f));
      return Status::OK();
    }());
    for (const auto& [tensor, shard] : j["weight_map"].items()) {
      const TensorView* v = reader->Find(tensor);
      if (v == nullptr) {
        return Status::Corruption(
            fmt::format("{} maps tensor '{}' to {}, which does not contain it",
                        index.string(), tensor, shard.get<std::string>()));
      }
    }
    return reader;
  }
  for (const auto& entry : std::filesystem::directory_iterator(path, ec)) {
    if (entry.path().extension() == ".safetensors")
      files.push_back(entry.path());
  }
  if (files.empty()) {
    return Status::NotFound(
        fmt::format("no model.safetensors.index.json or *.safetensors in {}",
                    path.string()));
  }
  std::sort(files.begin(), files.end());
  for (const auto& f : files) TIERKV_RETURN_IF_ERROR(reader->AddFile(f));
  return reader;
}

const TensorView* SafetensorsReader::Find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

std::vector<const TensorView*> SafetensorsReader::InFileOrder() const {
  std::vector<const TensorView*> out;
  out.reserve(tensors_.size());
  for (const auto& [n, v] : tensors_) out.push_back(&v);
  std::sort(out.begin(), out.end(),
            [](const TensorView* a, const TensorView* b) {
              return std::tie(a->file_index, a->file_offset, a->name) <
                     std::tie(b->file_index, b->file_offset, b->name);
            });
  return out;
}

std::vector<std::string> SafetensorsReader::Names() const {
  std::vector<std::string> names;
  names.reserve(tensors_.size());
  for (const auto& [n, v] : tensors_) names.push_back(n);
  return names;
}

Status WriteSafetensors(const std::filesystem::path& file,
                        std::span<const TensorSpec> tensors,
                        const TensorFiller& fill) {
  json header = json::object();
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    header[t.name] = {{"dtype", t.dtype},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.nbytes}}};
    offset += t.nbytes;
  }
  header["__metadata__"] = {{"format", "pt"}};
  std::string text = header.dump();
  while ((text.size() + 8) % 8 != 0) text.push_back(' ');  // align data to 8
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  if (!out) {
    return Status::IOError(fmt::format("cannot create {}", file.string()));
  }
  unsigned char len[8];
  const uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
  out.write(reinterpret_cast<const char*>(len), 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  std::vector<std::byte> buf;
  for (size_t i = 0; i < tensors.size(); ++i) {
    buf.assign(tensors[i].nbytes, std::byte{0});
    TIERKV_RETURN_IF_ERROR(fill(i, buf));
    out.write(reinterpret_cast<const char*>(buf.data()),
              static_cast<std::streamsize>(buf.size()));
  }
  out.flush();
  if (!out) {
    return Status::IOError(fmt::format("write to {} failed", file.string()));
  }
  return Status::OK();
}

Status WriteSafetensors(const std::filesystem::path& file,
                        const std::vector<RawTensor>& tensors) {
  std::vector<TensorSpec> specs;
  for (const auto& t : tensors) {
    specs.push_back({t.name, t.dtype, t.shape, t.bytes.size()});
  }
  return WriteSafetensors(file, specs, [&](size_t i, std::span<std::byte> out) {
    std::copy(tensors[i].bytes.begin(), tensors[i].bytes.end(), out.begin());
    return Status::OK();
  });
}

}  // namespace tierkv
