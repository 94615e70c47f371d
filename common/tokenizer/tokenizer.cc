// The Tokenizer: loads tokenizer.json (tokenizers/src/tokenizer/serialization.rs) into its stages
// and runs Encode / Decode over them as `tokenizers` does (tokenizers/src/tokenizer/mod.rs).
// Encode goes through the stages in this order:
//   added tokens in the raw text (added_tokens.h) · NFC (utf8.h) · added tokens in the normalized
//   text · pre-tokenizer (pre_tokenizer.h) · BPE (bpe_model.h) · post-processor (here:
//   TemplateProcessing, tokenizers/src/processors/template.rs)
// and Decode through the ByteLevel decoder (byte_level.h). Every tokenizer.json error names the
// JSON path of the offending value (common/json_reader.h, pointer style).
#include "common/tokenizer/tokenizer.h"

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/json_reader.h"
#include "common/status.h"
#include "common/tokenizer/added_tokens.h"
#include "common/tokenizer/bpe_model.h"
#include "common/tokenizer/byte_level.h"
#include "common/tokenizer/pre_tokenizer.h"
#include "common/tokenizer/split_regex.h"
#include "common/tokenizer/utf8.h"
#include "nlohmann/json.hpp"

namespace specwire {

using tokenizer_internal::AddedVocabulary;
using tokenizer_internal::Alphabet;
using tokenizer_internal::BytePairModel;
using tokenizer_internal::DecodeByteLevel;
using tokenizer_internal::FindInvalidUtf8;
using tokenizer_internal::kGpt2Pattern;
using tokenizer_internal::Nfc;
using tokenizer_internal::PreTokenizer;
using tokenizer_internal::Segment;
using tokenizer_internal::SplitBehavior;
using tokenizer_internal::SplitRegex;
using tokenizer_internal::SplitStep;

namespace {

using json = nlohmann::json;

// The "type" of a component ({"type": "BPE", ...}).
absl::StatusOr<std::string> ComponentType(const JsonReader& j) {
  if (!j.is_object()) return j.TypeErrorHere("an object");
  return j.String("type");
}

// A component type this tokenizer does not implement, named at `j`'s "type".
absl::Status Unsupported(const JsonReader& j, absl::string_view what, absl::string_view type,
                         absl::string_view supported) {
  return j.Error("type", absl::StrCat("unsupported ", what, " type \"", type,
                                      "\" (supported: ", supported, ")"));
}

// The BPE vocabulary {"token": id, ...} and the dense id -> token table.
absl::Status ReadVocab(const JsonReader& vocab, BytePairModel* model) {
  const json& entries = vocab.raw();
  int32_t max_id = -1;
  model->vocab.reserve(entries.size());
  for (const auto& [token, id] : entries.items()) {
    if (!id.is_number_unsigned() || id.get<uint64_t>() > INT32_MAX) {
      return vocab.Member(token).TypeErrorHere("an id in [0, 2^31)");
    }
    const auto value = static_cast<int32_t>(id.get<uint64_t>());
    // The id -> token table is dense; one stray huge id would make it gigabytes. Every HF file
    // numbers its vocabulary densely, so an id far beyond the vocabulary's size is refused.
    if (static_cast<uint64_t>(value) >= 4 * entries.size() + 65536) {
      return vocab.Member(token).TypeErrorHere(
          absl::StrCat("an id below ", 4 * entries.size() + 65536,
                       " (ids must be about as dense as the vocabulary)"));
    }
    model->vocab[token] = value;
    max_id = std::max(max_id, value);
  }
  model->vocab_r.assign(max_id + 1, std::string());
  model->has_id.assign(max_id + 1, false);
  for (const auto& [token, id] : model->vocab) {
    model->vocab_r[id] = token;
    model->has_id[id] = true;
  }
  return absl::OkStatus();
}

// Merges: [["a", "b"], ...] or the legacy ["a b", ...] (MergeType in
// tokenizers/src/models/bpe/serialization.rs); the rank is the position. A pair listed twice
// keeps its last rank, as HF's map collect does. Needs the vocabulary and
// continuing_subword_prefix already read.
absl::Status ReadMerges(const JsonReader& merges, BytePairModel* model) {
  const json& list = merges.raw();
  model->merges.reserve(list.size());
  int32_t rank = 0;
  for (size_t i = 0; i < list.size(); ++i) {
    const json& m = list[i];
    std::string a, b;
    if (m.is_string()) {
      const std::string line = m.get<std::string>();
      if (line.starts_with("#version")) continue;
      const size_t space = line.find(' ');
      if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
        return merges.Element(i).ErrorHere(
            absl::StrCat("merge \"", line, "\" is not two tokens separated by one space"));
      }
      a = line.substr(0, space);
      b = line.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    } else {
      return merges.Element(i).TypeErrorHere("\"a b\" or [\"a\", \"b\"]");
    }
    const size_t prefix_len = model->continuing_subword_prefix.size();
    const auto a_it = model->vocab.find(a);
    const auto b_it = model->vocab.find(b);
    if (a_it == model->vocab.end() || b_it == model->vocab.end() || b.size() < prefix_len) {
      return merges.Element(i).ErrorHere(absl::StrCat(
          "merge token \"", a_it == model->vocab.end() ? a : b, "\" is not in the vocabulary"));
    }
    const std::string merged = a + b.substr(prefix_len);
    const auto new_it = model->vocab.find(merged);
    if (new_it == model->vocab.end()) {
      return merges.Element(i).ErrorHere(
          absl::StrCat("merged token \"", merged, "\" is not in the vocabulary"));
    }
    model->merges[BytePairModel::PairKey(a_it->second, b_it->second)] = {rank++, new_it->second};
  }
  return absl::OkStatus();
}

// TemplateProcessing's special_tokens: {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}.
// Appends each entry's ids to `template_ids` and records where, by name, in `index`.
absl::Status ReadTemplateSpecialTokens(const JsonReader& specials,
                                       absl::flat_hash_map<std::string, int32_t>* index,
                                       std::vector<std::vector<int32_t>>* template_ids) {
  for (const auto& item : specials.raw().items()) {
    const std::string& name = item.key();
    const JsonReader special = specials.Member(name);
    if (!special.is_object()) return special.TypeErrorHere("an object");
    SW_ASSIGN_OR_RETURN(const JsonReader ids, special.Array("ids"));
    std::vector<int32_t> list;
    for (size_t k = 0; k < ids.size(); ++k) {
      const json& id = ids.raw()[k];
      if (!id.is_number_unsigned() || id.get<uint64_t>() > INT32_MAX) {
        return ids.Element(k).TypeErrorHere("an id in [0, 2^31)");
      }
      list.push_back(static_cast<int32_t>(id.get<uint64_t>()));
    }
    (*index)[name] = static_cast<int32_t>(template_ids->size());
    template_ids->push_back(std::move(list));
  }
  return absl::OkStatus();
}

}  // namespace

struct Tokenizer::Impl {
  BytePairModel model;
  bool nfc = false;  // the normalizer: NFC or nothing
  PreTokenizer pre_tokenizer;
  // Post-processor: TemplateProcessing "single" templates, applied in order (Sequence) when
  // add_special_tokens. Each element is -1 for "$A" or an index into template_ids.
  std::vector<std::vector<int32_t>> templates;
  std::vector<std::vector<int32_t>> template_ids;
  bool byte_level_decoder = false;
  AddedVocabulary added_vocab;
  int64_t vocab_size = 0;

  // One per component of tokenizer.json; `j` is the component's JSON value.
  absl::Status ParseModel(const JsonReader& j);
  absl::Status ParseNormalizer(const JsonReader& j);
  absl::Status ParsePreTokenizer(const JsonReader& j, bool* seen_byte_level);
  absl::Status ParsePostProcessor(const JsonReader& j);
  absl::Status ParseDecoder(const JsonReader& j);
  absl::Status ParseAddedTokens(const JsonReader& j);  // after ParseModel and ParseNormalizer
};

absl::Status Tokenizer::Impl::ParseModel(const JsonReader& j) {
  if (const json* type = j.Find("type");
      type != nullptr && (!type->is_string() || type->get<std::string>() != "BPE")) {
    return Unsupported(j, "model", type->is_string() ? type->get<std::string>() : type->dump(),
                       "BPE");
  }
  if (const json* dropout = j.Find("dropout");
      dropout != nullptr && !(dropout->is_number() && dropout->get<double>() == 0.0)) {
    return j.Error("dropout", absl::StrCat("BPE dropout ", dropout->dump(),
                                           " makes encoding random; only null or 0 is supported"));
  }
  SW_ASSIGN_OR_RETURN(model.ignore_merges, j.Bool("ignore_merges", false));
  SW_ASSIGN_OR_RETURN(model.fuse_unk, j.Bool("fuse_unk", false));
  SW_ASSIGN_OR_RETURN(model.byte_fallback, j.Bool("byte_fallback", false));
  SW_ASSIGN_OR_RETURN(model.unk_token, j.OptionalString("unk_token"));
  SW_ASSIGN_OR_RETURN(model.continuing_subword_prefix, j.String("continuing_subword_prefix", ""));
  SW_ASSIGN_OR_RETURN(model.end_of_word_suffix, j.String("end_of_word_suffix", ""));
  SW_ASSIGN_OR_RETURN(const JsonReader vocab, j.Object("vocab"));
  SW_RETURN_IF_ERROR(ReadVocab(vocab, &model));
  SW_ASSIGN_OR_RETURN(const JsonReader merges, j.Array("merges"));
  SW_RETURN_IF_ERROR(ReadMerges(merges, &model));
  model.BuildByteTables();
  return absl::OkStatus();
}

absl::Status Tokenizer::Impl::ParseNormalizer(const JsonReader& j) {
  SW_ASSIGN_OR_RETURN(const std::string type, ComponentType(j));
  if (type == "NFC") {
    nfc = true;
    return absl::OkStatus();
  }
  if (type == "Sequence") {
    SW_ASSIGN_OR_RETURN(const JsonReader list, j.Array("normalizers"));
    for (size_t i = 0; i < list.size(); ++i) {
      SW_RETURN_IF_ERROR(ParseNormalizer(list.Element(i)));
    }
    return absl::OkStatus();
  }
  return Unsupported(j, "normalizer", type, "NFC, Sequence");
}

absl::Status Tokenizer::Impl::ParsePreTokenizer(const JsonReader& j, bool* seen_byte_level) {
  SW_ASSIGN_OR_RETURN(const std::string type, ComponentType(j));
  if (*seen_byte_level) {
    return j.ErrorHere(
        absl::StrCat("pre-tokenizer \"", type,
                     "\" after ByteLevel is not supported (ByteLevel must be the last step)"));
  }
  if (type == "Sequence") {
    SW_ASSIGN_OR_RETURN(const JsonReader list, j.Array("pretokenizers"));
    for (size_t i = 0; i < list.size(); ++i) {
      SW_RETURN_IF_ERROR(ParsePreTokenizer(list.Element(i), seen_byte_level));
    }
    return absl::OkStatus();
  }
  if (type == "ByteLevel") {
    *seen_byte_level = true;
    SW_ASSIGN_OR_RETURN(pre_tokenizer.byte_level_prefix_space, j.Bool("add_prefix_space", true));
    SW_ASSIGN_OR_RETURN(const bool use_regex, j.Bool("use_regex", true));
    if (use_regex) {
      SW_ASSIGN_OR_RETURN(pre_tokenizer.byte_level_regex,
                          SplitRegex::Compile(kGpt2Pattern, false, j.path()));
    }
    return absl::OkStatus();
  }
  if (type == "Split") {
    SplitStep step;
    SW_ASSIGN_OR_RETURN(const JsonReader pattern, j.Required("pattern"));
    const bool regex = pattern.Has("Regex"), literal = pattern.Has("String");
    if (regex == literal) return pattern.TypeErrorHere("{\"Regex\": ...} or {\"String\": ...}");
    const char* const kind = regex ? "Regex" : "String";
    SW_ASSIGN_OR_RETURN(const std::string text, pattern.String(kind));
    SW_ASSIGN_OR_RETURN(step.regex, SplitRegex::Compile(text, literal, pattern.PathOf(kind)));
    SW_ASSIGN_OR_RETURN(const std::string behavior, j.String("behavior"));
    static const std::pair<const char*, SplitBehavior> kBehaviors[] = {
        {"Removed", SplitBehavior::kRemoved},
        {"Isolated", SplitBehavior::kIsolated},
        {"MergedWithPrevious", SplitBehavior::kMergedWithPrevious},
        {"MergedWithNext", SplitBehavior::kMergedWithNext},
        {"Contiguous", SplitBehavior::kContiguous}};
    bool known = false;
    for (const auto& [name, value] : kBehaviors) {
      if (behavior == name) step.behavior = value, known = true;
    }
    if (!known) {
      return j.Error("behavior", absl::StrCat("unknown split behavior \"", behavior, "\""));
    }
    SW_ASSIGN_OR_RETURN(step.invert, j.Bool("invert", false));
    pre_tokenizer.splits.push_back(std::move(step));
    return absl::OkStatus();
  }
  return Unsupported(j, "pre_tokenizer", type, "ByteLevel, Split, Sequence");
}

absl::Status Tokenizer::Impl::ParsePostProcessor(const JsonReader& j) {
  SW_ASSIGN_OR_RETURN(const std::string type, ComponentType(j));
  if (type == "ByteLevel") return absl::OkStatus();  // offsets only
  if (type == "Sequence") {
    SW_ASSIGN_OR_RETURN(const JsonReader list, j.Array("processors"));
    for (size_t i = 0; i < list.size(); ++i) {
      SW_RETURN_IF_ERROR(ParsePostProcessor(list.Element(i)));
    }
    return absl::OkStatus();
  }
  if (type != "TemplateProcessing") {
    return Unsupported(j, "post_processor", type, "ByteLevel, TemplateProcessing, Sequence");
  }
  absl::flat_hash_map<std::string, int32_t> special_index;
  if (j.Has("special_tokens")) {
    SW_ASSIGN_OR_RETURN(const JsonReader specials, j.Object("special_tokens"));
    SW_RETURN_IF_ERROR(ReadTemplateSpecialTokens(specials, &special_index, &template_ids));
  }
  // single: [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", ...}}]
  SW_ASSIGN_OR_RETURN(const JsonReader single, j.Array("single"));
  std::vector<int32_t> pieces;
  for (size_t i = 0; i < single.size(); ++i) {
    const JsonReader piece = single.Element(i);
    if (!piece.is_object() || piece.size() != 1) {
      return piece.TypeErrorHere("{\"Sequence\": ...} or {\"SpecialToken\": ...}");
    }
    if (piece.Has("Sequence")) {
      SW_ASSIGN_OR_RETURN(const std::string id, piece.Member("Sequence").String("id"));
      if (id != "A") {
        return piece.ErrorHere(
            absl::StrCat("the single-sequence template refers to sequence ", id));
      }
      pieces.push_back(-1);
    } else if (piece.Has("SpecialToken")) {
      SW_ASSIGN_OR_RETURN(const std::string id, piece.Member("SpecialToken").String("id"));
      const auto it = special_index.find(id);
      if (it == special_index.end()) {
        return piece.ErrorHere(absl::StrCat("special token \"", id, "\" is not in special_tokens"));
      }
      pieces.push_back(it->second);
    } else {
      return piece.TypeErrorHere("{\"Sequence\": ...} or {\"SpecialToken\": ...}");
    }
  }
  templates.push_back(std::move(pieces));
  return absl::OkStatus();
}

absl::Status Tokenizer::Impl::ParseDecoder(const JsonReader& j) {
  SW_ASSIGN_OR_RETURN(const std::string type, ComponentType(j));
  if (type != "ByteLevel") return Unsupported(j, "decoder", type, "ByteLevel");
  byte_level_decoder = true;
  return absl::OkStatus();
}

// The entries of "added_tokens" as the file writes them; AddedVocabulary assigns their ids.
absl::Status Tokenizer::Impl::ParseAddedTokens(const JsonReader& j) {
  std::vector<AddedToken> tokens;
  tokens.reserve(j.size());
  for (size_t i = 0; i < j.size(); ++i) {
    const JsonReader t = j.Element(i);
    if (!t.is_object()) return t.TypeErrorHere("an object");
    AddedToken token;
    SW_ASSIGN_OR_RETURN(token.content, t.String("content"));
    SW_ASSIGN_OR_RETURN(token.special, t.Bool("special", false));
    SW_ASSIGN_OR_RETURN(token.single_word, t.Bool("single_word", false));
    SW_ASSIGN_OR_RETURN(token.lstrip, t.Bool("lstrip", false));
    SW_ASSIGN_OR_RETURN(token.rstrip, t.Bool("rstrip", false));
    SW_ASSIGN_OR_RETURN(token.normalized, t.Bool("normalized", !token.special));
    tokens.push_back(std::move(token));
  }
  return added_vocab.AddTokens(std::move(tokens), model.vocab, nfc);
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromJson(const std::string& json_text) {
  SW_ASSIGN_OR_RETURN(const json doc, JsonReader::Parse(json_text, "tokenizer.json"));
  if (!doc.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer.json /: expected an object, got ", doc.type_name()));
  }
  const JsonReader root(doc, "tokenizer.json", PathStyle::kPointer);
  auto impl = std::make_unique<Impl>();

  if (const json* version = root.Find("version");
      version != nullptr && !(version->is_string() && version->get<std::string>() == "1.0")) {
    return root.Error("version", absl::StrCat("unknown version ", version->dump()));
  }
  for (const char* key : {"truncation", "padding"}) {
    if (root.Has(key)) {
      return root.Error(key,
                        absl::StrCat("must be null (", key, " would change the ids of Encode)"));
    }
  }
  SW_ASSIGN_OR_RETURN(const JsonReader model, root.Object("model"));
  SW_RETURN_IF_ERROR(impl->ParseModel(model));
  if (root.Has("normalizer")) {
    SW_RETURN_IF_ERROR(impl->ParseNormalizer(root.Member("normalizer")));
  }
  bool seen_byte_level = false;
  if (root.Has("pre_tokenizer")) {
    SW_RETURN_IF_ERROR(impl->ParsePreTokenizer(root.Member("pre_tokenizer"), &seen_byte_level));
  }
  if (!seen_byte_level) {
    return root.Error("pre_tokenizer", "no ByteLevel step; only byte-level BPE is supported");
  }
  if (root.Has("post_processor")) {
    SW_RETURN_IF_ERROR(impl->ParsePostProcessor(root.Member("post_processor")));
  }
  if (root.Has("decoder")) {
    SW_RETURN_IF_ERROR(impl->ParseDecoder(root.Member("decoder")));
  }
  if (root.Has("added_tokens")) {
    SW_ASSIGN_OR_RETURN(const JsonReader added_tokens, root.Array("added_tokens"));
    SW_RETURN_IF_ERROR(impl->ParseAddedTokens(added_tokens));
  }
  impl->vocab_size = static_cast<int64_t>(impl->model.vocab_r.size());
  for (const AddedToken& t : impl->added_vocab.tokens()) {
    impl->vocab_size = std::max(impl->vocab_size, t.id + 1);
  }
  for (const auto& ids : impl->template_ids) {
    for (int32_t id : ids) {
      if (id >= impl->vocab_size) {
        return root.Error("post_processor",
                          absl::StrCat("special token id ", id, " is not below the vocab size ",
                                       impl->vocab_size));
      }
    }
  }
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(impl)));
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open tokenizer file ", path));
  std::stringstream buffer;
  buffer << in.rdbuf();
  auto tokenizer = FromJson(buffer.str());
  if (!tokenizer.ok()) return Annotate(tokenizer.status(), path);
  return tokenizer;
}

absl::StatusOr<std::vector<int64_t>> Tokenizer::Encode(absl::string_view text,
                                                       bool add_special_tokens) const {
  if (const size_t bad = FindInvalidUtf8(text); bad != absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("text is not valid UTF-8 (ill-formed sequence at byte ", bad, ")"));
  }
  const Impl& m = *impl_;
  // 1. Added tokens with normalized == false, in the raw text.
  std::vector<Segment> raw_segments;
  m.added_vocab.SplitOnRawTokens(std::string(text), &raw_segments);
  // 2. Normalize the rest, then find the normalized added tokens in it.
  std::vector<Segment> segments;
  for (Segment& s : raw_segments) {
    if (s.token_id >= 0) {
      segments.push_back(std::move(s));
      continue;
    }
    if (m.nfc) {
      SW_ASSIGN_OR_RETURN(s.text, Nfc(s.text));
    }
    m.added_vocab.SplitOnNormalizedTokens(s.text, &segments);
  }
  // 3. Pre-tokenize and encode each piece.
  std::vector<int64_t> ids;
  ids.reserve(text.size() / 3 + 4);
  std::vector<std::string> pieces;
  for (Segment& s : segments) {
    if (s.token_id >= 0) {
      ids.push_back(s.token_id);
      continue;
    }
    if (s.text.empty()) continue;
    pieces.clear();
    SW_RETURN_IF_ERROR(m.pre_tokenizer.PreTokenize(std::move(s.text), &pieces));
    for (const std::string& piece : pieces) SW_RETURN_IF_ERROR(m.model.Tokenize(piece, &ids));
  }
  // 4. Post-process.
  if (add_special_tokens) {
    for (const std::vector<int32_t>& pieces_of_template : m.templates) {
      std::vector<int64_t> wrapped;
      wrapped.reserve(ids.size() + 4);
      for (int32_t piece : pieces_of_template) {
        if (piece < 0) {
          wrapped.insert(wrapped.end(), ids.begin(), ids.end());
        } else {
          const auto& special = m.template_ids[piece];
          wrapped.insert(wrapped.end(), special.begin(), special.end());
        }
      }
      ids = std::move(wrapped);
    }
  }
  return ids;
}

absl::StatusOr<std::vector<std::string>> Tokenizer::PreTokenize(absl::string_view text) const {
  if (const size_t bad = FindInvalidUtf8(text); bad != absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("text is not valid UTF-8 (ill-formed sequence at byte ", bad, ")"));
  }
  std::vector<std::string> pieces;
  if (text.empty()) return pieces;
  SW_RETURN_IF_ERROR(impl_->pre_tokenizer.PreTokenize(std::string(text), &pieces));
  for (std::string& piece : pieces) piece = Alphabet().Encode(piece);
  return pieces;
}

absl::StatusOr<std::string> Tokenizer::Decode(const std::vector<int64_t>& ids,
                                              bool skip_special_tokens) const {
  const Impl& m = *impl_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    std::optional<std::string> token = id_to_token(ids[i]);
    if (!token.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat("ids[", i, "] = ", ids[i], " has no token (vocab size ", m.vocab_size, ")"));
    }
    if (skip_special_tokens && m.added_vocab.IsSpecial(*token)) continue;
    tokens.push_back(std::move(*token));
  }
  if (!m.byte_level_decoder) return absl::StrJoin(tokens, " ");
  return DecodeByteLevel(tokens);
}

int64_t Tokenizer::vocab_size() const { return impl_->vocab_size; }

std::optional<int64_t> Tokenizer::token_to_id(absl::string_view token) const {
  const std::string key(token);
  if (const std::optional<int32_t> id = impl_->added_vocab.IdOf(key)) return *id;
  if (const auto it = impl_->model.vocab.find(key); it != impl_->model.vocab.end()) {
    return it->second;
  }
  return std::nullopt;
}

std::optional<std::string> Tokenizer::id_to_token(int64_t id) const {
  if (id < 0 || id > INT32_MAX) return std::nullopt;
  const auto id32 = static_cast<int32_t>(id);
  if (std::optional<std::string> content = impl_->added_vocab.ContentOf(id32)) return content;
  if (id32 < static_cast<int32_t>(impl_->model.vocab_r.size()) && impl_->model.has_id[id32]) {
    return impl_->model.vocab_r[id32];
  }
  return std::nullopt;
}

const std::vector<AddedToken>& Tokenizer::added_tokens() const {
  return impl_->added_vocab.tokens();
}

std::vector<std::string> Tokenizer::special_tokens() const {
  std::vector<std::string> out;
  for (const AddedToken& t : impl_->added_vocab.tokens()) {
    if (t.special) out.push_back(t.content);
  }
  return out;
}

}  // namespace specwire
