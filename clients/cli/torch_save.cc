#include "clients/cli/torch_save.h"

#include <array>

#include "absl/strings/str_cat.h"
#include "common/enum_names.h"

namespace specwire {
namespace {

constexpr char kArchive[] = "archive";

void Le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

// torch's legacy storage class of each dtype, as torch.save pickles it.
constexpr EnumName<DType> kStorageClasses[] = {{DType::kBF16, "BFloat16Storage"},
                                               {DType::kF16, "HalfStorage"},
                                               {DType::kF32, "FloatStorage"},
                                               {DType::kI64, "LongStorage"},
                                               {DType::kBool, "BoolStorage"}};

// Protocol-2 pickle opcodes, as Python's pickle writes them.
class Pickle {
 public:
  Pickle() { out_ = "\x80\x02"; }
  void Mark() { out_ += '('; }
  void Tuple() { out_ += 't'; }
  void EmptyTuple() { out_ += ')'; }
  void EmptyDict() { out_ += '}'; }
  void SetItems() { out_ += 'u'; }
  void False() { out_ += '\x89'; }
  void Reduce() { out_ += 'R'; }
  void PersistentId() { out_ += 'Q'; }
  void Global(const std::string& module, const std::string& name) {
    out_ += 'c';
    out_ += module + "\n" + name + "\n";
  }
  void String(const std::string& s) {
    out_ += 'X';
    Le(out_, s.size(), 4);
    out_ += s;
  }
  void Int(int64_t v) {
    if (v >= 0 && v < 256) {
      out_ += 'K';
      Le(out_, static_cast<uint64_t>(v), 1);
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
      out_ += 'J';
      Le(out_, static_cast<uint64_t>(static_cast<uint32_t>(static_cast<int32_t>(v))), 4);
    } else {  // LONG1: 8 little-endian two's-complement bytes
      out_ += '\x8a';
      out_ += '\x08';
      Le(out_, static_cast<uint64_t>(v), 8);
    }
  }
  std::string Finish() { return out_ + '.'; }

 private:
  std::string out_;
};

// A stored zip of `records`, every record's data 64-byte aligned (a padding extra field in its
// local header, as torch's writer does).
std::string Zip(const std::vector<std::pair<std::string, std::string>>& records) {
  std::string out, central;
  for (const auto& [name, data] : records) {
    const uint64_t offset = out.size();
    const uint32_t crc = Crc32(data);
    const size_t header = 30 + name.size() + 4;  // + the extra field's id and length
    const size_t pad = (64 - (offset + header) % 64) % 64;
    Le(out, 0x04034b50, 4);
    Le(out, 20, 2);  // version needed
    Le(out, 0, 2);   // flags
    Le(out, 0, 2);   // stored
    Le(out, 0, 4);   // time, date
    Le(out, crc, 4);
    Le(out, data.size(), 4);
    Le(out, data.size(), 4);
    Le(out, name.size(), 2);
    Le(out, 4 + pad, 2);
    out += name;
    Le(out, 0x4246, 2);  // "FB": torch's padding field
    Le(out, pad, 2);
    out.append(pad, 'Z');
    out += data;

    Le(central, 0x02014b50, 4);
    Le(central, 20, 2);  // version made by
    Le(central, 20, 2);  // version needed
    Le(central, 0, 2);
    Le(central, 0, 2);
    Le(central, 0, 4);
    Le(central, crc, 4);
    Le(central, data.size(), 4);
    Le(central, data.size(), 4);
    Le(central, name.size(), 2);
    Le(central, 0, 2);  // extra
    Le(central, 0, 2);  // comment
    Le(central, 0, 2);  // disk
    Le(central, 0, 2);  // internal attributes
    Le(central, 0, 4);  // external attributes
    Le(central, offset, 4);
    central += name;
  }
  const uint64_t central_offset = out.size();
  out += central;
  Le(out, 0x06054b50, 4);
  Le(out, 0, 4);  // disk numbers
  Le(out, records.size(), 2);
  Le(out, records.size(), 2);
  Le(out, central.size(), 4);
  Le(out, central_offset, 4);
  Le(out, 0, 2);
  return out;
}

}  // namespace

uint32_t Crc32(const std::string& bytes) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  uint32_t c = 0xFFFFFFFFu;
  for (unsigned char b : bytes) c = table[(c ^ b) & 0xff] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

std::string TorchSaveDict(const std::vector<SavedTensor>& tensors) {
  Pickle p;
  p.EmptyDict();
  p.Mark();
  for (size_t i = 0; i < tensors.size(); ++i) {
    const SavedTensor& t = tensors[i];
    int64_t numel = 1;
    for (int64_t d : t.shape) numel *= d;
    p.String(t.name);
    p.Global("torch._utils", "_rebuild_tensor_v2");
    p.Mark();
    p.Mark();  // the persistent id: ("storage", class, key, location, numel)
    p.String("storage");
    p.Global("torch", NameOf(kStorageClasses, t.dtype));
    p.String(std::to_string(i));
    p.String("cpu");
    p.Int(numel);
    p.Tuple();
    p.PersistentId();
    p.Int(0);  // storage offset
    p.Mark();
    for (int64_t d : t.shape) p.Int(d);
    p.Tuple();
    p.Mark();
    std::vector<int64_t> strides(t.shape.size(), 1);
    for (size_t d = t.shape.size(); d-- > 1;) strides[d - 1] = strides[d] * t.shape[d];
    for (int64_t s : strides) p.Int(s);
    p.Tuple();
    p.False();  // requires_grad
    p.Global("collections", "OrderedDict");
    p.EmptyTuple();
    p.Reduce();  // backward hooks
    p.Tuple();
    p.Reduce();
  }
  p.SetItems();
  const std::string a = kArchive;
  std::vector<std::pair<std::string, std::string>> records = {{a + "/data.pkl", p.Finish()},
                                                              {a + "/.format_version", "1"},
                                                              {a + "/.storage_alignment", "64"},
                                                              {a + "/byteorder", "little"}};
  for (size_t i = 0; i < tensors.size(); ++i) {
    records.push_back({absl::StrCat(a, "/data/", i), tensors[i].bytes});
  }
  records.push_back({a + "/version", "3\n"});
  return Zip(records);
}

}  // namespace specwire
