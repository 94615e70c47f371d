// Typed reads of a JSON document whose errors name the file and the key: the one reader behind
// config.json (model_config.cc), tokenizer.json (common/tokenizer/) and a drafter's config.json
// (services/scorer/drafter.cc).
//
// A JsonReader is a non-owning view of one JSON value plus where it sits in its document. Keys
// that are absent or null count as absent everywhere (transformers reads them with .get(), where
// null means "use the default"). Every error is INVALID_ARGUMENT and reads
//   <source>: key "<path>" <problem>        (PathStyle::kDotted, config files:
//   "rope_scaling.factor") <source> <path>: <problem>              (PathStyle::kPointer,
//   tokenizer.json: "/model/vocab/h")
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace specwire {

enum class PathStyle { kDotted, kPointer };

class JsonReader {
 public:
  using json = nlohmann::json;

  // `j` must outlive the reader and every reader made from it.
  JsonReader(const json& j, std::string source, PathStyle style = PathStyle::kDotted,
             std::string path = "");

  // Parses a whole document; INVALID_ARGUMENT "<source>: not valid JSON" otherwise.
  static absl::StatusOr<json> Parse(absl::string_view text, absl::string_view source);

  const json& raw() const { return *j_; }
  const std::string& source() const { return source_; }
  const std::string& path() const { return path_; }  // "" at the top level
  // The path of a member or an element ("a.b" / "/a/b"; "a[3]" / "/a/3").
  std::string PathOf(absl::string_view key) const;
  std::string PathOf(size_t index) const;

  bool is_object() const { return j_->is_object(); }
  bool is_array() const { return j_->is_array(); }
  size_t size() const { return j_->size(); }

  // Present and not null.
  bool Has(absl::string_view key) const;
  // The member (nullptr when absent or null).
  const json* Find(absl::string_view key) const;
  // A reader for a member or an element; the member must be present.
  JsonReader Member(absl::string_view key) const;
  JsonReader Element(size_t index) const;

  // Required members.
  absl::StatusOr<int64_t> Int(absl::string_view key) const;
  absl::StatusOr<int64_t> PositiveInt(absl::string_view key) const;
  absl::StatusOr<double> Double(absl::string_view key) const;
  absl::StatusOr<std::string> String(absl::string_view key) const;
  // Members with a default when absent or null.
  absl::StatusOr<int64_t> Int(absl::string_view key, int64_t dflt) const;
  absl::StatusOr<double> Double(absl::string_view key, double dflt) const;
  absl::StatusOr<bool> Bool(absl::string_view key, bool dflt) const;
  absl::StatusOr<std::string> String(absl::string_view key, std::string dflt) const;
  absl::StatusOr<std::optional<std::string>> OptionalString(absl::string_view key) const;
  absl::StatusOr<std::optional<int64_t>> OptionalInt(absl::string_view key) const;
  absl::StatusOr<std::optional<double>> OptionalDouble(absl::string_view key) const;
  // An integer or a list of integers (eos_token_id); empty when absent.
  absl::StatusOr<std::vector<int64_t>> IntOrIntList(absl::string_view key) const;
  absl::StatusOr<std::vector<int64_t>> IntList(absl::string_view key) const;
  // A member that must be an object / an array.
  absl::StatusOr<JsonReader> Object(absl::string_view key) const;
  absl::StatusOr<JsonReader> Array(absl::string_view key) const;
  // A member of any type that must be present, for values whose shape the caller checks.
  absl::StatusOr<JsonReader> Required(absl::string_view key) const;

  // The value itself.
  absl::StatusOr<int64_t> AsInt() const;
  absl::StatusOr<std::string> AsString() const;

  // "<source>: key "<path of key>" <problem>" (or the pointer form).
  absl::Status Error(absl::string_view key, absl::string_view problem) const;
  // The same for this value itself.
  absl::Status ErrorHere(absl::string_view problem) const;
  // This value is not what it should be, for checks the typed reads above do not cover
  // (`want` = "an id in [0, 2^31)"): "expected <want>, got <JSON type>" (kPointer) or
  // "must be <want>, got <value>" (kDotted).
  absl::Status TypeErrorHere(absl::string_view want) const;

 private:
  absl::Status ErrorAt(const std::string& path, absl::string_view problem) const;

  const json* j_;
  std::string source_;
  PathStyle style_;
  std::string path_;
};

}  // namespace specwire
