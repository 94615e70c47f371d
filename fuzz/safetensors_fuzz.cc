// The safetensors reader on arbitrary files: Open either refuses with an error or hands out views
// that lie inside the file and tile its data section; a file it accepts survives a write / read
// round trip unchanged.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common/safetensors.h"
#include "fuzz/fuzz_check.h"

namespace specwire {
namespace {

// The input as a regular file: a memfd, opened through /proc like any path.
std::string InputPath(const uint8_t* data, size_t size) {
  static int fd = -1;
  if (fd < 0) {
    fd = memfd_create("safetensors_fuzz", 0);
    FUZZ_CHECK(fd >= 0, "memfd_create failed");
  }
  FUZZ_CHECK(ftruncate(fd, 0) == 0, "ftruncate");
  size_t off = 0;
  while (off < size) {
    ssize_t w = pwrite(fd, data + off, size - off, static_cast<off_t>(off));
    FUZZ_CHECK(w > 0, "pwrite");
    off += static_cast<size_t>(w);
  }
  return "/proc/self/fd/" + std::to_string(fd);
}

std::string RoundTripDir() {
  static std::string dir = [] {
    std::string tmpl = std::string(std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp") +
                       "/safetensors_fuzz.XXXXXX";
    FUZZ_CHECK(mkdtemp(tmpl.data()) != nullptr, "mkdtemp");
    return tmpl;
  }();
  return dir;
}

void CheckAccepted(const SafetensorsFile& f, const uint8_t* data, size_t size) {
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | data[i];
  const uint64_t data_start = 8 + header_len;
  FUZZ_CHECK(data_start <= size, "accepted a header running past the file");
  // Views point into the mapping; the first tensor (offset 0) fixes where the data section is.
  const std::byte* section = nullptr;
  uint64_t total = 0;
  for (const auto& [name, t] : f.tensors()) {
    FUZZ_CHECK(name == t.name, "map key differs from the view's name");
    FUZZ_CHECK(t.nbytes == static_cast<uint64_t>(t.numel()) * DTypeSize(t.dtype),
               "%s: %zu bytes for %lld elements", name.c_str(), t.nbytes,
               static_cast<long long>(t.numel()));
    if (section == nullptr || t.data < section) section = t.data;
    total += t.nbytes;
  }
  for (const auto& [name, t] : f.tensors()) {
    const uint64_t begin = static_cast<uint64_t>(t.data - section);
    FUZZ_CHECK(begin + t.nbytes <= size - data_start, "%s ends past the file", name.c_str());
    // The bytes must be those of the file.
    if (t.nbytes > 0) {
      FUZZ_CHECK(std::memcmp(t.data, data + data_start + begin, t.nbytes) == 0,
                 "%s: bytes differ from the file", name.c_str());
    }
  }
  FUZZ_CHECK(total <= size - data_start, "tensors hold more bytes than the data section");

  // Write what was read and read it back: the same tensors, metadata and bytes.
  std::vector<TensorToWrite> out;
  for (const auto& [name, t] : f.tensors()) {
    out.push_back({name, t.dtype, t.shape, {t.data, t.nbytes}});
  }
  const std::string path = RoundTripDir() + "/rt.safetensors";
  absl::Status written = WriteSafetensors(path, out, f.metadata());
  FUZZ_CHECK(written.ok(), "cannot write back an accepted file: %s",
             std::string(written.message()).c_str());
  auto again = SafetensorsFile::Open(path);
  FUZZ_CHECK(again.ok(), "cannot read back a written file: %s",
             std::string(again.status().message()).c_str());
  FUZZ_CHECK((*again)->metadata() == f.metadata(), "metadata changed in the round trip");
  FUZZ_CHECK((*again)->tensors().size() == f.tensors().size(), "tensor count changed");
  for (const auto& [name, t] : f.tensors()) {
    const TensorView* u = (*again)->Find(name);
    FUZZ_CHECK(u != nullptr, "%s lost in the round trip", name.c_str());
    FUZZ_CHECK(u->dtype == t.dtype && u->shape == t.shape && u->nbytes == t.nbytes,
               "%s changed in the round trip", name.c_str());
    FUZZ_CHECK(t.nbytes == 0 || std::memcmp(u->data, t.data, t.nbytes) == 0,
               "%s: bytes changed in the round trip", name.c_str());
  }
  unlink(path.c_str());
}

}  // namespace
}  // namespace specwire

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace specwire;
  auto file = SafetensorsFile::Open(InputPath(data, size));
  if (!file.ok()) {
    fuzz::CheckError(file.status());
    const auto code = file.status().code();
    FUZZ_CHECK(code == absl::StatusCode::kInvalidArgument || code == absl::StatusCode::kDataLoss,
               "unexpected code %d: %s", static_cast<int>(code),
               std::string(file.status().message()).c_str());
    return 0;
  }
  CheckAccepted(**file, data, size);
  return 0;
}
