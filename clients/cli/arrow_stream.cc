#include "clients/cli/arrow_stream.h"

#include <algorithm>
#include <cstring>
#include <memory>

namespace specwire {
namespace {

// A flatbuffers object tree, serialised front to back: every uoffset points forward to a later
// object, each table's vtable sits just before the table, and every scalar is aligned to its size
// from the buffer's start (the flatbuffers verifier checks that).
struct Fb;
using FbPtr = std::shared_ptr<const Fb>;

struct FbField {
  int id = 0;
  int size = 0;       // bytes of a scalar; 4 for an offset
  uint64_t bits = 0;  // the scalar's value
  FbPtr child;        // set: an offset to this object
};

struct Fb {
  enum Kind { kTable, kString, kTableVector, kStructVector } kind = kTable;
  std::vector<FbField> fields;  // kTable
  std::string bytes;            // kString; kStructVector: the structs' bytes
  size_t count = 0;             // kStructVector
  std::vector<FbPtr> items;     // kTableVector
};

FbPtr Table(std::vector<FbField> fields) {
  auto t = std::make_shared<Fb>();
  t->fields = std::move(fields);
  return t;
}

FbPtr String(std::string s) {
  auto t = std::make_shared<Fb>();
  t->kind = Fb::kString;
  t->bytes = std::move(s);
  return t;
}

FbPtr Tables(std::vector<FbPtr> items) {
  auto t = std::make_shared<Fb>();
  t->kind = Fb::kTableVector;
  t->items = std::move(items);
  return t;
}

// A vector of structs of two int64s each (FieldNode, Buffer).
FbPtr LongPairs(const std::vector<std::pair<int64_t, int64_t>>& pairs) {
  auto t = std::make_shared<Fb>();
  t->kind = Fb::kStructVector;
  t->count = pairs.size();
  for (const auto& [a, b] : pairs) {
    for (int64_t v : {a, b}) {
      for (int i = 0; i < 8; ++i) t->bytes.push_back(static_cast<char>((static_cast<uint64_t>(v) >> (8 * i)) & 0xff));
    }
  }
  return t;
}

FbField Scalar(int id, int size, uint64_t v) { return {id, size, v, nullptr}; }
FbField Child(int id, FbPtr c) { return {id, 4, 0, std::move(c)}; }

class FbWriter {
 public:
  std::string Finish(const Fb& root) {
    buf_.assign(4, '\0');
    Patch(0, Emit(root));
    Pad(8, 0);
    return std::move(buf_);
  }

 private:
  void Pad(size_t align, size_t rem) {
    while (buf_.size() % align != rem) buf_.push_back('\0');
  }
  void Put(uint64_t v, int size) {
    for (int i = 0; i < size; ++i) buf_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
  void Set(size_t at, uint64_t v, int size) {
    for (int i = 0; i < size; ++i) buf_[at + i] = static_cast<char>((v >> (8 * i)) & 0xff);
  }
  void Patch(size_t at, size_t target) { Set(at, target - at, 4); }

  size_t Emit(const Fb& n) {
    switch (n.kind) {
      case Fb::kString: {
        Pad(4, 0);
        const size_t p = buf_.size();
        Put(n.bytes.size(), 4);
        buf_ += n.bytes;
        buf_.push_back('\0');
        return p;
      }
      case Fb::kStructVector: {
        Pad(8, 4);  // the 8-byte structs start right after the 4-byte length
        const size_t p = buf_.size();
        Put(n.count, 4);
        buf_ += n.bytes;
        return p;
      }
      case Fb::kTableVector: {
        Pad(4, 0);
        const size_t p = buf_.size();
        Put(n.items.size(), 4);
        const size_t slots = buf_.size();
        buf_.append(4 * n.items.size(), '\0');
        for (size_t i = 0; i < n.items.size(); ++i) Patch(slots + 4 * i, Emit(*n.items[i]));
        return p;
      }
      case Fb::kTable:
        break;
    }
    // The table starts at 4 mod 8, so after its 4-byte soffset the widest fields come first and
    // each field lands aligned to its size.
    std::vector<const FbField*> order;
    for (const FbField& f : n.fields) order.push_back(&f);
    std::stable_sort(order.begin(), order.end(),
                     [](const FbField* a, const FbField* b) { return a->size > b->size; });
    std::vector<size_t> offset_of(order.size());
    int max_id = -1;
    size_t end = 4;
    for (size_t i = 0; i < order.size(); ++i) {
      while ((4 + end) % order[i]->size != 0) ++end;  // the table itself is at 4 mod 8
      offset_of[i] = end;
      end += order[i]->size;
      max_id = std::max(max_id, order[i]->id);
    }
    const size_t vtable_size = 4 + 2 * static_cast<size_t>(max_id + 1);
    Pad(2, 0);
    while ((buf_.size() + vtable_size) % 8 != 4) Put(0, 2);
    const size_t v = buf_.size();
    Put(vtable_size, 2);
    Put(end, 2);
    for (int id = 0; id <= max_id; ++id) {
      size_t at = 0;
      for (size_t i = 0; i < order.size(); ++i) {
        if (order[i]->id == id) at = offset_of[i];
      }
      Put(at, 2);
    }
    const size_t t = buf_.size();
    buf_.append(end, '\0');
    Set(t, t - v, 4);  // soffset: the vtable is at t - soffset
    for (size_t i = 0; i < order.size(); ++i) {
      if (!order[i]->child) Set(t + offset_of[i], order[i]->bits, order[i]->size);
    }
    for (size_t i = 0; i < order.size(); ++i) {
      if (order[i]->child) Patch(t + offset_of[i], Emit(*order[i]->child));
    }
    return t;
  }

  std::string buf_;
};

// Arrow's Message.fbs / Schema.fbs numbering.
constexpr uint64_t kMetadataV5 = 4;
constexpr uint64_t kHeaderSchema = 1, kHeaderRecordBatch = 3;
constexpr uint64_t kTypeInt = 2, kTypeList = 12;

FbPtr Int64Type() { return Table({Scalar(0, 4, 64), Scalar(1, 1, 1)}); }

FbPtr FieldOf(const std::string& name, bool is_list) {
  std::vector<FbPtr> children;
  if (is_list) {
    children.push_back(Table({Child(0, String("item")), Scalar(1, 1, 1), Scalar(2, 1, kTypeInt),
                              Child(3, Int64Type()), Child(5, Tables({}))}));
  }
  return Table({Child(0, String(name)), Scalar(1, 1, 1),
                Scalar(2, 1, is_list ? kTypeList : kTypeInt),
                Child(3, is_list ? Table({}) : Int64Type()), Child(5, Tables(std::move(children)))});
}

FbPtr Message(uint64_t header_type, FbPtr header, int64_t body_length) {
  return Table({Scalar(0, 2, kMetadataV5), Scalar(1, 1, header_type), Child(2, std::move(header)),
                Scalar(3, 8, static_cast<uint64_t>(body_length))});
}

void AppendU32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

// One encapsulated message: continuation marker, metadata length, metadata (padded so the body
// starts 8-aligned), body.
void AppendMessage(std::string& out, const FbPtr& message, const std::string& body) {
  std::string meta = FbWriter().Finish(*message);
  while ((8 + meta.size()) % 8 != 0) meta.push_back('\0');
  AppendU32(out, 0xFFFFFFFFu);
  AppendU32(out, static_cast<uint32_t>(meta.size()));
  out += meta;
  out += body;
}

template <typename T>
void AppendBuffer(std::string& body, std::vector<std::pair<int64_t, int64_t>>& buffers,
                  const std::vector<T>& values) {
  const int64_t offset = static_cast<int64_t>(body.size());
  const size_t n = values.size() * sizeof(T);
  body.append(reinterpret_cast<const char*>(values.data()), n);  // little-endian host
  buffers.push_back({offset, static_cast<int64_t>(n)});
  while (body.size() % 8 != 0) body.push_back('\0');
}

}  // namespace

ArrowColumn ArrowListColumn(std::string name, const std::vector<std::vector<int64_t>>& rows) {
  ArrowColumn c{std::move(name), true, {}, {0}};
  for (const auto& r : rows) {
    c.values.insert(c.values.end(), r.begin(), r.end());
    c.offsets.push_back(static_cast<int32_t>(c.values.size()));
  }
  return c;
}

std::string ArrowStream(const std::vector<ArrowColumn>& columns,
                        const std::map<std::string, std::string>& schema_metadata) {
  std::vector<FbPtr> fields, metadata;
  for (const ArrowColumn& c : columns) fields.push_back(FieldOf(c.name, c.is_list));
  for (const auto& [k, v] : schema_metadata) {
    metadata.push_back(Table({Child(0, String(k)), Child(1, String(v))}));
  }
  std::string out;
  AppendMessage(out,
                Message(kHeaderSchema,
                        Table({Scalar(0, 2, 0), Child(1, Tables(std::move(fields))),
                               Child(2, Tables(std::move(metadata)))}),
                        0),
                "");

  const int64_t rows =
      columns.empty() ? 0
                      : static_cast<int64_t>(columns[0].is_list ? columns[0].offsets.size() - 1
                                                                : columns[0].values.size());
  std::string body;
  std::vector<std::pair<int64_t, int64_t>> nodes, buffers;
  const std::vector<uint8_t> no_validity;
  for (const ArrowColumn& c : columns) {
    nodes.push_back({rows, 0});
    AppendBuffer(body, buffers, no_validity);
    if (c.is_list) {
      AppendBuffer(body, buffers, c.offsets);
      nodes.push_back({static_cast<int64_t>(c.values.size()), 0});
      AppendBuffer(body, buffers, no_validity);
    }
    AppendBuffer(body, buffers, c.values);
  }
  AppendMessage(out,
                Message(kHeaderRecordBatch,
                        Table({Scalar(0, 8, static_cast<uint64_t>(rows)), Child(1, LongPairs(nodes)),
                               Child(2, LongPairs(buffers))}),
                        static_cast<int64_t>(body.size())),
                body);
  AppendU32(out, 0xFFFFFFFFu);  // end of stream
  AppendU32(out, 0);
  return out;
}

}  // namespace specwire
