#include "common/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>
#include <string_view>
#include <tuple>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/enum_names.h"
#include "common/status.h"
#include "nlohmann/json.hpp"

namespace specwire {
namespace {

using Json = nlohmann::json;

// `path: tensor "name": problem`, the prefix every per-tensor error carries.
std::string TensorContext(const std::string& path, const std::string& name) {
  return absl::StrCat(path, ": tensor \"", name, "\"");
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// Byte count of `shape` × element size, or an error if a dimension is negative or the product
// does not fit in 64 bits (a hostile header could otherwise wrap around to a small, valid size).
absl::StatusOr<uint64_t> ShapeBytes(const std::vector<int64_t>& shape, DType dtype) {
  uint64_t n = DTypeSize(dtype);
  for (int64_t d : shape) {
    if (d < 0) return absl::InvalidArgumentError(absl::StrCat("negative dimension ", d));
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape ", ShapeString(shape), " of ", DTypeName(dtype), " overflows"));
    }
  }
  return n;
}

uint64_t DecodeU64LE(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

void EncodeU64LE(uint64_t v, unsigned char* p) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}

absl::Status ErrnoError(int err, const char* what, const std::string& path) {
  return absl::ErrnoToStatus(err, absl::StrCat(path, ": ", what));
}

// One entry of the header, before its offsets are turned into a pointer.
struct ParsedEntry {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0;
  uint64_t end = 0;
};

// Parses {"dtype", "shape", "data_offsets"}; errors carry no prefix (the caller adds file + name).
absl::StatusOr<ParsedEntry> ParseEntry(const std::string& name, const Json& j) {
  if (!j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat("entry is ", j.type_name(), ", not an object"));
  }
  ParsedEntry e;
  e.name = name;

  auto dtype_it = j.find("dtype");
  if (dtype_it == j.end() || !dtype_it->is_string()) {
    return absl::InvalidArgumentError("missing string \"dtype\"");
  }
  SW_ASSIGN_OR_RETURN(e.dtype, ParseDTypeName(dtype_it->get_ref<const std::string&>()));

  auto shape_it = j.find("shape");
  if (shape_it == j.end() || !shape_it->is_array()) {
    return absl::InvalidArgumentError("missing array \"shape\"");
  }
  for (const Json& d : *shape_it) {
    const char* problem;
    if (!d.is_number_integer()) {
      problem = "non-integer";
    } else if (d.is_number_unsigned() ? d.get<uint64_t>() > INT64_MAX : d.get<int64_t>() < 0) {
      problem = d.is_number_unsigned() ? "oversized" : "negative";
    } else {
      e.shape.push_back(d.get<int64_t>());
      continue;
    }
    return absl::InvalidArgumentError(
        absl::StrCat("shape ", shape_it->dump(), " has ", problem, " dimension ", d.dump()));
  }

  auto off_it = j.find("data_offsets");
  if (off_it == j.end()) return absl::InvalidArgumentError("missing \"data_offsets\"");
  if (!off_it->is_array() || off_it->size() != 2 || !(*off_it)[0].is_number_unsigned() ||
      !(*off_it)[1].is_number_unsigned()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data_offsets ", off_it->dump(), " is not a pair of non-negative integers [begin, end]"));
  }
  e.begin = (*off_it)[0].get<uint64_t>();
  e.end = (*off_it)[1].get<uint64_t>();
  if (e.begin > e.end) {
    return absl::InvalidArgumentError(
        absl::StrCat("data_offsets [", e.begin, ", ", e.end, ") begin after end"));
  }

  SW_ASSIGN_OR_RETURN(uint64_t want, ShapeBytes(e.shape, e.dtype));
  if (e.end - e.begin != want) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data_offsets [", e.begin, ", ", e.end, ") hold ", e.end - e.begin, " bytes but shape ",
        ShapeString(e.shape), " of ", DTypeName(e.dtype), " needs ", want));
  }
  return e;
}

absl::StatusOr<std::map<std::string, std::string>> ParseMetadata(const std::string& path,
                                                                 const Json& j) {
  std::map<std::string, std::string> out;
  // The Rust reader accepts `null` as "no metadata"; so do we.
  if (j.is_null()) return out;
  if (!j.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": __metadata__ is ", j.type_name(), ", not an object"));
  }
  for (const auto& [k, v] : j.items()) {
    if (!v.is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": __metadata__ \"", k, "\" is ", v.type_name(), ", not a string"));
    }
    out.emplace(k, v.get<std::string>());
  }
  return out;
}

// Writes all of `data`, retrying short writes and EINTR.
bool WriteAll(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

}  // namespace

constexpr EnumName<DType> kDTypeNames[] = {{DType::kBF16, "BF16"},
                                           {DType::kF16, "F16"},
                                           {DType::kF32, "F32"},
                                           {DType::kI64, "I64"},
                                           {DType::kBool, "BOOL"}};

const char* DTypeName(DType d) { return NameOf(kDTypeNames, d); }

size_t DTypeSize(DType d) {
  switch (d) {
    case DType::kBF16:
    case DType::kF16:
      return 2;
    case DType::kF32:
      return 4;
    case DType::kI64:
      return 8;
    case DType::kBool:
      return 1;
  }
  return 0;
}

bool IsFloat(DType d) { return d == DType::kBF16 || d == DType::kF16 || d == DType::kF32; }

absl::StatusOr<DType> ParseDTypeName(std::string_view name) {
  if (std::optional<DType> d = ValueOf(kDTypeNames, name)) return *d;
  // Debian's absl has its own string_view type, which std::string_view does not convert to.
  return absl::InvalidArgumentError(
      absl::StrCat("dtype \"", absl::string_view(name.data(), name.size()),
                   "\" is not supported (expected one of ", NamesOf(kDTypeNames, ", "), ")"));
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(errno, "cannot open", path);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return ErrnoError(err, "cannot stat", path);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < 8) {
    ::close(fd);
    return absl::DataLossError(absl::StrCat(path, ": file is ", file_size,
                                            " bytes, shorter than the 8-byte header length"));
  }

  // The unique_ptr owns the mapping from here on, so every early return below unmaps it.
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  void* map = ::mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd, 0);
  int map_err = errno;
  // The mapping keeps the file alive; the descriptor is no longer needed.
  ::close(fd);
  if (map == MAP_FAILED) return ErrnoError(map_err, "cannot mmap", path);
  file->map_ = map;
  file->map_size_ = file_size;
  const auto* bytes = static_cast<const unsigned char*>(map);

  const uint64_t header_len = DecodeU64LE(bytes);
  if (header_len > kMaxHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": header length ", header_len,
                                                   " exceeds the limit of ", kMaxHeaderBytes));
  }
  if (header_len > file_size - 8) {
    return absl::DataLossError(absl::StrCat(path, ": header length ", header_len,
                                            " runs past the end of the file (", file_size,
                                            " bytes)"));
  }
  const uint64_t data_start = 8 + header_len;
  const uint64_t data_size = file_size - data_start;

  // nlohmann keeps the last of repeated keys silently; a repeated tensor name would hide a
  // tensor, so the parse callback records top-level keys and flags the first repeat.
  std::set<std::string> seen_keys;
  std::string repeated_key;
  Json::parser_callback_t on_event = [&](int depth, Json::parse_event_t event, Json& parsed) {
    if (depth == 1 && event == Json::parse_event_t::key && repeated_key.empty()) {
      const auto& key = parsed.get_ref<const std::string&>();
      if (!seen_keys.insert(key).second) repeated_key = key;
    }
    return true;
  };
  const char* header_begin = reinterpret_cast<const char*>(bytes + 8);
  Json header;
  try {
    header = Json::parse(header_begin, header_begin + header_len, on_event);
  } catch (const Json::exception& e) {
    // Caught rather than parsed with allow_exceptions=false: the message carries the position.
    return absl::InvalidArgumentError(absl::StrCat(path, ": header is not valid JSON: ", e.what()));
  }
  if (!header.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": header is a JSON ", header.type_name(), ", not an object"));
  }
  if (!repeated_key.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": header key \"", repeated_key, "\" appears more than once"));
  }

  std::vector<ParsedEntry> entries;
  for (const auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      SW_ASSIGN_OR_RETURN(file->metadata_, ParseMetadata(path, value));
      continue;
    }
    auto entry = ParseEntry(key, value);
    if (!entry.ok()) return Annotate(entry.status(), TensorContext(path, key));
    if (entry->end > data_size) {
      return absl::DataLossError(
          absl::StrCat(TensorContext(path, key), ": data_offsets [", entry->begin, ", ", entry->end,
                       ") run past the end of the data section (", data_size, " bytes)"));
    }
    entries.push_back(*std::move(entry));
  }

  // Tensors must tile the data section from offset 0 in offset order. Ties on `begin` come from
  // zero-element tensors; ordering them by `end` keeps them ahead of the tensor that follows.
  std::sort(entries.begin(), entries.end(), [](const ParsedEntry& a, const ParsedEntry& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  uint64_t expected_begin = 0;
  const ParsedEntry* prev = nullptr;
  for (const ParsedEntry& e : entries) {
    if (e.begin < expected_begin) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": tensors \"", prev->name, "\" [", prev->begin, ", ", prev->end,
                       ") and \"", e.name, "\" [", e.begin, ", ", e.end, ") overlap"));
    }
    if (e.begin > expected_begin) {
      if (prev == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat(TensorContext(path, e.name), ": first tensor starts at ", e.begin,
                         ", leaving a gap at the start of the data section"));
      }
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": gap of ", e.begin - expected_begin, " bytes between tensors \"",
                       prev->name, "\" [", prev->begin, ", ", prev->end, ") and \"", e.name, "\" [",
                       e.begin, ", ", e.end, ")"));
    }
    expected_begin = e.end;
    prev = &e;
  }

  const std::byte* data = static_cast<const std::byte*>(map) + data_start;
  for (ParsedEntry& e : entries) {
    TensorView view;
    view.name = e.name;
    view.dtype = e.dtype;
    view.shape = std::move(e.shape);
    view.data = data + e.begin;
    view.nbytes = e.end - e.begin;
    file->tensors_.emplace(e.name, std::move(view));
  }
  return file;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(map_, map_size_);
}

const TensorView* SafetensorsFile::Find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  std::vector<const TensorToWrite*> sorted;
  sorted.reserve(tensors.size());
  for (const TensorToWrite& t : tensors) sorted.push_back(&t);
  std::sort(sorted.begin(), sorted.end(),
            [](const TensorToWrite* a, const TensorToWrite* b) { return a->name < b->name; });

  Json header = Json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (size_t i = 0; i < sorted.size(); ++i) {
    const TensorToWrite& t = *sorted[i];
    const std::string context = absl::StrCat(path, ": tensor \"", t.name, "\"");
    if (t.name == "__metadata__") {
      return absl::InvalidArgumentError(absl::StrCat(context, ": name is reserved"));
    }
    if (i > 0 && sorted[i - 1]->name == t.name) {
      return absl::InvalidArgumentError(absl::StrCat(context, ": name appears more than once"));
    }
    auto want = ShapeBytes(t.shape, t.dtype);
    if (!want.ok()) return Annotate(want.status(), context);
    if (t.bytes.size() != *want) {
      return absl::InvalidArgumentError(
          absl::StrCat(context, ": ", t.bytes.size(), " bytes given but shape ",
                       ShapeString(t.shape), " of ", DTypeName(t.dtype), " needs ", *want));
    }
    header[t.name] = {{"dtype", DTypeName(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + *want}}};
    offset += *want;
  }

  std::string header_text;
  try {
    header_text = header.dump();
  } catch (const Json::exception& e) {
    // dump() throws on names or metadata that are not valid UTF-8.
    return absl::InvalidArgumentError(absl::StrCat(path, ": cannot encode header: ", e.what()));
  }
  // Padding keeps the data section 8-byte aligned in the file (and so in a page-aligned mapping).
  header_text.append((8 - header_text.size() % 8) % 8, ' ');
  unsigned char len_bytes[8];
  EncodeU64LE(header_text.size(), len_bytes);

  const std::string tmp_path = absl::StrCat(path, ".tmp.", ::getpid());
  int fd = ::open(tmp_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError(errno, "cannot create", tmp_path);
  bool ok = WriteAll(fd, len_bytes, sizeof(len_bytes)) &&
            WriteAll(fd, header_text.data(), header_text.size());
  for (size_t i = 0; ok && i < sorted.size(); ++i) {
    ok = WriteAll(fd, sorted[i]->bytes.data(), sorted[i]->bytes.size());
  }
  // fsync before rename so a crash leaves either the old file or the complete new one.
  ok = ok && ::fsync(fd) == 0;
  int err = errno;
  if (::close(fd) != 0 && ok) {
    ok = false;
    err = errno;
  }
  if (!ok) {
    ::unlink(tmp_path.c_str());
    return ErrnoError(err, "cannot write", tmp_path);
  }
  if (::rename(tmp_path.c_str(), path.c_str()) != 0) {
    err = errno;
    ::unlink(tmp_path.c_str());
    return absl::ErrnoToStatus(err, absl::StrCat("cannot rename ", tmp_path, " to ", path));
  }
  return absl::OkStatus();
}

}  // namespace specwire
