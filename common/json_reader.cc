#include "common/json_reader.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace specwire {

JsonReader::JsonReader(const json& j, std::string source, PathStyle style, std::string path)
    : j_(&j), source_(std::move(source)), style_(style), path_(std::move(path)) {}

absl::StatusOr<nlohmann::json> JsonReader::Parse(absl::string_view text, absl::string_view source) {
  json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(source, ": not valid JSON"));
  return j;
}

std::string JsonReader::PathOf(absl::string_view key) const {
  if (style_ == PathStyle::kPointer) return absl::StrCat(path_, "/", key);
  return path_.empty() ? std::string(key) : absl::StrCat(path_, ".", key);
}

std::string JsonReader::PathOf(size_t index) const {
  if (style_ == PathStyle::kPointer) return absl::StrCat(path_, "/", index);
  return absl::StrCat(path_, "[", index, "]");
}

bool JsonReader::Has(absl::string_view key) const { return Find(key) != nullptr; }

const nlohmann::json* JsonReader::Find(absl::string_view key) const {
  if (!j_->is_object()) return nullptr;
  const auto it = j_->find(std::string(key));
  if (it == j_->end() || it->is_null()) return nullptr;
  return &*it;
}

JsonReader JsonReader::Member(absl::string_view key) const {
  return JsonReader(j_->at(std::string(key)), source_, style_, PathOf(key));
}

JsonReader JsonReader::Element(size_t index) const {
  return JsonReader(j_->at(index), source_, style_, PathOf(index));
}

namespace {

// What a value should have been, in the two styles' words.
struct Want {
  const char* dotted;   // "must be an integer"
  const char* pointer;  // "an integer"
};
constexpr Want kInteger{"must be an integer", "an integer"};
constexpr Want kNumber{"must be a number", "a number"};
constexpr Want kBoolean{"must be true or false", "a boolean"};
constexpr Want kString{"must be a string", "a string"};
constexpr Want kObject{"must be an object", "an object"};
constexpr Want kArray{"must be an array", "an array"};

}  // namespace

absl::Status JsonReader::ErrorAt(const std::string& path, absl::string_view problem) const {
  if (style_ == PathStyle::kPointer) {
    return absl::InvalidArgumentError(absl::StrCat(source_, " ", path, ": ", problem));
  }
  return absl::InvalidArgumentError(absl::StrCat(source_, ": key \"", path, "\" ", problem));
}

absl::Status JsonReader::Error(absl::string_view key, absl::string_view problem) const {
  return ErrorAt(PathOf(key), problem);
}

absl::Status JsonReader::ErrorHere(absl::string_view problem) const {
  return ErrorAt(path_, problem);
}

absl::Status JsonReader::TypeErrorHere(absl::string_view want) const {
  return ErrorAt(path_, style_ == PathStyle::kPointer
                            ? absl::StrCat("expected ", want, ", got ", j_->type_name())
                            : absl::StrCat("must be ", want, ", got ", j_->dump()));
}

#define SW_JSON_TYPE_ERROR(path, want, value)                                                  \
  ErrorAt(path, style_ == PathStyle::kPointer                                                  \
                    ? absl::StrCat("expected ", (want).pointer, ", got ", (value).type_name()) \
                    : absl::StrCat((want).dotted, ", got ", (value).dump()))

absl::StatusOr<int64_t> JsonReader::Int(absl::string_view key) const {
  const json* v = Find(key);
  if (v == nullptr) {
    return Error(key, style_ == PathStyle::kPointer ? "missing" : "is required but missing");
  }
  if (!v->is_number_integer()) return SW_JSON_TYPE_ERROR(PathOf(key), kInteger, *v);
  return v->get<int64_t>();
}

absl::StatusOr<int64_t> JsonReader::Int(absl::string_view key, int64_t dflt) const {
  return Has(key) ? Int(key) : absl::StatusOr<int64_t>(dflt);
}

absl::StatusOr<int64_t> JsonReader::PositiveInt(absl::string_view key) const {
  SW_ASSIGN_OR_RETURN(int64_t v, Int(key));
  if (v <= 0) return Error(key, absl::StrCat("must be positive, got ", v));
  return v;
}

absl::StatusOr<double> JsonReader::Double(absl::string_view key) const {
  const json* v = Find(key);
  if (v == nullptr) {
    return Error(key, style_ == PathStyle::kPointer ? "missing" : "is required but missing");
  }
  if (!v->is_number()) return SW_JSON_TYPE_ERROR(PathOf(key), kNumber, *v);
  return v->get<double>();
}

absl::StatusOr<double> JsonReader::Double(absl::string_view key, double dflt) const {
  return Has(key) ? Double(key) : absl::StatusOr<double>(dflt);
}

absl::StatusOr<bool> JsonReader::Bool(absl::string_view key, bool dflt) const {
  const json* v = Find(key);
  if (v == nullptr) return dflt;
  if (!v->is_boolean()) return SW_JSON_TYPE_ERROR(PathOf(key), kBoolean, *v);
  return v->get<bool>();
}

absl::StatusOr<std::string> JsonReader::String(absl::string_view key) const {
  const json* v = Find(key);
  if (v == nullptr) {
    return Error(key, style_ == PathStyle::kPointer ? "missing" : "is required but missing");
  }
  if (!v->is_string()) return SW_JSON_TYPE_ERROR(PathOf(key), kString, *v);
  return v->get<std::string>();
}

absl::StatusOr<std::string> JsonReader::String(absl::string_view key, std::string dflt) const {
  return Has(key) ? String(key) : absl::StatusOr<std::string>(std::move(dflt));
}

absl::StatusOr<std::optional<std::string>> JsonReader::OptionalString(absl::string_view key) const {
  if (!Has(key)) return std::optional<std::string>();
  SW_ASSIGN_OR_RETURN(std::string s, String(key));
  return std::optional<std::string>(std::move(s));
}

absl::StatusOr<std::optional<int64_t>> JsonReader::OptionalInt(absl::string_view key) const {
  if (!Has(key)) return std::optional<int64_t>();
  SW_ASSIGN_OR_RETURN(int64_t v, Int(key));
  return std::optional<int64_t>(v);
}

absl::StatusOr<std::optional<double>> JsonReader::OptionalDouble(absl::string_view key) const {
  if (!Has(key)) return std::optional<double>();
  SW_ASSIGN_OR_RETURN(double v, Double(key));
  return std::optional<double>(v);
}

absl::StatusOr<std::vector<int64_t>> JsonReader::IntOrIntList(absl::string_view key) const {
  const json* v = Find(key);
  if (v == nullptr) return std::vector<int64_t>();
  if (v->is_number_integer()) return std::vector<int64_t>{v->get<int64_t>()};
  if (!v->is_array()) return Error(key, "must be an integer or a list of integers");
  return IntList(key);
}

absl::StatusOr<std::vector<int64_t>> JsonReader::IntList(absl::string_view key) const {
  SW_ASSIGN_OR_RETURN(JsonReader list, Array(key));
  std::vector<int64_t> out;
  out.reserve(list.size());
  for (size_t i = 0; i < list.size(); ++i) {
    const json& e = list.raw()[i];
    if (!e.is_number_integer()) return Error(key, "must hold integers");
    out.push_back(e.get<int64_t>());
  }
  return out;
}

absl::StatusOr<JsonReader> JsonReader::Object(absl::string_view key) const {
  const json* v = Find(key);
  if (v == nullptr) {
    return Error(key, style_ == PathStyle::kPointer ? "missing" : "is required but missing");
  }
  if (!v->is_object()) return SW_JSON_TYPE_ERROR(PathOf(key), kObject, *v);
  return JsonReader(*v, source_, style_, PathOf(key));
}

absl::StatusOr<JsonReader> JsonReader::Array(absl::string_view key) const {
  const json* v = Find(key);
  if (v == nullptr) {
    return Error(key, style_ == PathStyle::kPointer ? "missing" : "is required but missing");
  }
  if (!v->is_array()) return SW_JSON_TYPE_ERROR(PathOf(key), kArray, *v);
  return JsonReader(*v, source_, style_, PathOf(key));
}

absl::StatusOr<JsonReader> JsonReader::Required(absl::string_view key) const {
  const json* v = Find(key);
  if (v == nullptr) {
    return Error(key, style_ == PathStyle::kPointer ? "missing" : "is required but missing");
  }
  return JsonReader(*v, source_, style_, PathOf(key));
}

absl::StatusOr<int64_t> JsonReader::AsInt() const {
  if (!j_->is_number_integer()) return SW_JSON_TYPE_ERROR(path_, kInteger, *j_);
  return j_->get<int64_t>();
}

absl::StatusOr<std::string> JsonReader::AsString() const {
  if (!j_->is_string()) return SW_JSON_TYPE_ERROR(path_, kString, *j_);
  return j_->get<std::string>();
}

#undef SW_JSON_TYPE_ERROR

}  // namespace specwire
