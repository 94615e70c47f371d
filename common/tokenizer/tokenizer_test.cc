#include "common/tokenizer/tokenizer.h"

#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace specwire {
namespace {

using json = nlohmann::json;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kQwen2Pattern[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// GPT-2's byte -> printable character table (the fixture's own copy, as a cross-check).
std::string ByteChar(int b) {
  int n = 0;
  for (int x = 0; x < 256; ++x) {
    const bool printable = (x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE;
    const int cp = printable ? x : 0x100 + n++;
    if (x == b) {
      std::string s;
      if (cp < 0x80) {
        s += static_cast<char>(cp);
      } else {
        s += static_cast<char>(0xC0 | (cp >> 6));
        s += static_cast<char>(0x80 | (cp & 0x3F));
      }
      return s;
    }
  }
  return "";
}

std::string Mapped(const std::string& bytes) {
  std::string out;
  for (unsigned char c : bytes) out += ByteChar(c);
  return out;
}

// A tiny Qwen2-style tokenizer: the 256 byte tokens (id = byte value) and a few merges, ids
// 256.. in merge order. Merges are given as raw-byte pairs and written in the byte alphabet.
json TinyTokenizer() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[ByteChar(b)] = b;
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"h", "e"},   {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {" ", "w"},   {"o", "r"},
      {" w", "or"}, {" ", " "}, {" ", "b"},   {"1", "2"},    {"\n", "\n"}, {"'", "s"}};
  json merge_list = json::array();
  int next = 256;
  for (const auto& [a, b] : merges) {
    vocab[Mapped(a + b)] = next++;
    merge_list.push_back(json::array({Mapped(a), Mapped(b)}));
  }
  vocab["abc"] = next++;  // reachable only through ignore_merges
  json doc = {{"version", "1.0"},
              {"truncation", nullptr},
              {"padding", nullptr},
              {"added_tokens", json::array()},
              {"normalizer", {{"type", "NFC"}}},
              {"pre_tokenizer",
               {{"type", "Sequence"},
                {"pretokenizers", json::array({{{"type", "Split"},
                                                {"pattern", {{"Regex", kQwen2Pattern}}},
                                                {"behavior", "Isolated"},
                                                {"invert", false}},
                                               {{"type", "ByteLevel"},
                                                {"add_prefix_space", false},
                                                {"trim_offsets", false},
                                                {"use_regex", false}}})}}},
              {"post_processor",
               {{"type", "ByteLevel"},
                {"add_prefix_space", false},
                {"trim_offsets", false},
                {"use_regex", false}}},
              {"decoder",
               {{"type", "ByteLevel"},
                {"add_prefix_space", false},
                {"trim_offsets", false},
                {"use_regex", false}}},
              {"model",
               {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", nullptr},
                {"continuing_subword_prefix", ""},
                {"end_of_word_suffix", ""},
                {"fuse_unk", false},
                {"byte_fallback", false},
                {"ignore_merges", false},
                {"vocab", vocab},
                {"merges", merge_list}}}};
  return doc;
}

json Added(const std::string& content, int id, bool special, bool lstrip = false,
           bool rstrip = false, bool single_word = false, bool normalized = false) {
  return {{"id", id},          {"content", content}, {"single_word", single_word},
          {"lstrip", lstrip},  {"rstrip", rstrip},   {"normalized", normalized},
          {"special", special}};
}

std::unique_ptr<Tokenizer> Load(const json& doc) {
  auto tokenizer = Tokenizer::FromJson(doc.dump());
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
  return tokenizer.ok() ? std::move(*tokenizer) : nullptr;
}

std::vector<int64_t> Enc(const Tokenizer& t, const std::string& text, bool special = false) {
  auto ids = t.Encode(text, special);
  EXPECT_TRUE(ids.ok()) << ids.status();
  return ids.ok() ? *ids : std::vector<int64_t>{};
}

int64_t Id(const Tokenizer& t, const std::string& raw_bytes) {
  auto id = t.token_to_id(Mapped(raw_bytes));
  EXPECT_TRUE(id.has_value()) << raw_bytes;
  return id.value_or(-1);
}

TEST(TokenizerTest, MergesInRankOrder) {
  auto t = Load(TinyTokenizer());
  ASSERT_NE(t, nullptr);
  EXPECT_THAT(Enc(*t, "hello"), ElementsAre(Id(*t, "hello")));
  EXPECT_THAT(Enc(*t, "hello world"), ElementsAre(Id(*t, "hello"), Id(*t, " wor"), 'l', 'd'));
  EXPECT_THAT(Enc(*t, "hel"), ElementsAre(Id(*t, "he"), 'l'));
  EXPECT_THAT(Enc(*t, ""), ElementsAre());
}

TEST(TokenizerTest, Qwen2SplitKeepsDigitsApartAndUsesLookahead) {
  auto t = Load(TinyTokenizer());
  ASSERT_NE(t, nullptr);
  // \p{N} is one digit per piece, so the "12" merge never applies.
  EXPECT_THAT(Enc(*t, "12"), ElementsAre('1', '2'));
  // "a   b": \s+(?!\S) leaves the last space to " b".
  EXPECT_THAT(Enc(*t, "a   b"), ElementsAre('a', Id(*t, "  "), Id(*t, " b")));
  // Case-insensitive contractions: 'S is its own piece, no merge for it.
  EXPECT_THAT(Enc(*t, "it's"), ElementsAre('i', 't', Id(*t, "'s")));
  EXPECT_THAT(Enc(*t, "IT'S"), ElementsAre('I', 'T', '\'', 'S'));
  EXPECT_THAT(Enc(*t, "\n\n"), ElementsAre(Id(*t, "\n\n")));
}

TEST(TokenizerTest, PreTokenizeShowsPiecesInTheByteAlphabet) {
  auto t = Load(TinyTokenizer());
  ASSERT_NE(t, nullptr);
  auto pieces = t->PreTokenize("a   b\n12");
  ASSERT_TRUE(pieces.ok()) << pieces.status();
  EXPECT_THAT(*pieces, ElementsAre("a", Mapped("  "), Mapped(" b"), Mapped("\n"), "1", "2"));
  EXPECT_THAT(*t->PreTokenize(""), ElementsAre());
}

TEST(TokenizerTest, SplitBehaviorsWithALiteralPattern) {
  // HF's documented example: splitting "the-final--countdown" on "-".
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"Removed", {"the", "final", "countdown"}},
      {"Isolated", {"the", "-", "final", "-", "-", "countdown"}},
      {"MergedWithPrevious", {"the-", "final-", "-", "countdown"}},
      {"MergedWithNext", {"the", "-final", "-", "-countdown"}},
      {"Contiguous", {"the", "-", "final", "--", "countdown"}}};
  for (const auto& [behavior, want] : cases) {
    json doc = TinyTokenizer();
    doc["pre_tokenizer"]["pretokenizers"][0] = {{"type", "Split"},
                                                {"pattern", {{"String", "-"}}},
                                                {"behavior", behavior},
                                                {"invert", false}};
    auto t = Load(doc);
    ASSERT_NE(t, nullptr);
    auto pieces = t->PreTokenize("the-final--countdown");
    ASSERT_TRUE(pieces.ok()) << pieces.status();
    EXPECT_EQ(*pieces, want) << behavior;
  }
}

TEST(TokenizerTest, RoundTripsArbitraryUtf8) {
  auto t = Load(TinyTokenizer());
  ASSERT_NE(t, nullptr);
  for (const std::string text :
       {"hello world", "def f(x):\n\treturn x ** 2\r\n", "日本語のテキスト",
        "👩‍👩‍👧 family", "  leading and trailing  ", "1234567890", "IT'S ALL'LL"}) {
    auto ids = t->Encode(text);
    ASSERT_TRUE(ids.ok()) << ids.status();
    auto back = t->Decode(*ids);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, text);
  }
}

TEST(TokenizerTest, NfcNormalizesBeforeSplitting) {
  auto t = Load(TinyTokenizer());
  ASSERT_NE(t, nullptr);
  // "e" + COMBINING ACUTE ACCENT and the precomposed "é" encode alike.
  EXPECT_EQ(Enc(*t, "caf\x65\xCC\x81"), Enc(*t, "caf\xC3\xA9"));
  EXPECT_THAT(Enc(*t, "\xC3\xA9"), ElementsAre(0xC3, 0xA9));
}

TEST(TokenizerTest, AddedTokensMatchInlineLongestFirst) {
  json doc = TinyTokenizer();
  const int base = static_cast<int>(doc["model"]["vocab"].size());
  doc["added_tokens"] =
      json::array({Added("<|im_start|>", base, true), Added("<|im_end|>", base + 1, true),
                   Added("<x>", base + 2, false), Added("<x>y", base + 3, false)});
  auto t = Load(doc);
  ASSERT_NE(t, nullptr);
  EXPECT_THAT(Enc(*t, "<|im_start|>hello<|im_end|>"), ElementsAre(base, Id(*t, "hello"), base + 1));
  EXPECT_THAT(Enc(*t, "a<x>yz<x>"), ElementsAre('a', base + 3, 'z', base + 2));
  // Decode keeps special tokens unless asked to skip them.
  const std::vector<int64_t> ids = {base, Id(*t, "hello"), base + 1, base + 2};
  EXPECT_EQ(*t->Decode(ids), "<|im_start|>hello<|im_end|><x>");
  EXPECT_EQ(*t->Decode(ids, /*skip_special_tokens=*/true), "hello<x>");
  EXPECT_THAT(t->special_tokens(), ElementsAre("<|im_start|>", "<|im_end|>"));
  EXPECT_EQ(t->token_to_id("<|im_end|>"), base + 1);
  EXPECT_EQ(t->id_to_token(base + 3), "<x>y");
  EXPECT_EQ(t->vocab_size(), base + 4);
  EXPECT_EQ(t->added_tokens().size(), 4u);
}

TEST(TokenizerTest, AddedTokenStripAndSingleWordFlags) {
  json doc = TinyTokenizer();
  const int base = static_cast<int>(doc["model"]["vocab"].size());
  doc["added_tokens"] = json::array({Added("<m>", base, true, /*lstrip=*/true, /*rstrip=*/true),
                                     Added("cat", base + 1, false, false, false,
                                           /*single_word=*/true)});
  auto t = Load(doc);
  ASSERT_NE(t, nullptr);
  EXPECT_THAT(Enc(*t, "a  <m>  b"), ElementsAre('a', base, 'b'));
  EXPECT_THAT(Enc(*t, "a cat b"), ElementsAre('a', ' ', base + 1, Id(*t, " b")));
  EXPECT_THAT(Enc(*t, "cats"), ElementsAre('c', 'a', 't', 's'));  // glued to a word character
}

TEST(TokenizerTest, NormalizedAddedTokenMatchesNormalizedText) {
  json doc = TinyTokenizer();
  const int base = static_cast<int>(doc["model"]["vocab"].size());
  // Written decomposed; matched after NFC, so the precomposed input finds it too.
  doc["added_tokens"] = json::array({Added("x\x65\xCC\x81", base, false, false, false, false,
                                           /*normalized=*/true)});
  auto t = Load(doc);
  ASSERT_NE(t, nullptr);
  EXPECT_THAT(Enc(*t, "ax\xC3\xA9"), ElementsAre('a', base));
  EXPECT_THAT(Enc(*t, "ax\x65\xCC\x81"), ElementsAre('a', base));
  EXPECT_EQ(t->id_to_token(base), "x\xC3\xA9");  // HF decodes the normalized form
}

TEST(TokenizerTest, AddedTokenIdsFollowHfNotTheFile) {
  json doc = TinyTokenizer();
  const int base = static_cast<int>(doc["model"]["vocab"].size());
  // A token already in the vocabulary keeps its id; new ones take the next ids in order.
  doc["added_tokens"] =
      json::array({Added("he", 999, false), Added("<a>", 5000, true), Added("<b>", 7, true)});
  auto t = Load(doc);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->token_to_id("he"), Id(*t, "he"));
  EXPECT_EQ(t->token_to_id("<a>"), base);
  EXPECT_EQ(t->token_to_id("<b>"), base + 1);
}

TEST(TokenizerTest, TemplateProcessingAddsBos) {
  json doc = TinyTokenizer();
  const int bos = static_cast<int>(doc["model"]["vocab"].size());
  doc["added_tokens"] = json::array({Added("<|begin_of_text|>", bos, true)});
  doc["post_processor"] = {
      {"type", "Sequence"},
      {"processors",
       json::array({{{"type", "ByteLevel"},
                     {"add_prefix_space", true},
                     {"trim_offsets", false},
                     {"use_regex", true}},
                    {{"type", "TemplateProcessing"},
                     {"single", json::array({{{"SpecialToken",
                                               {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}},
                                             {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
                     {"pair", json::array()},
                     {"special_tokens",
                      {{"<|begin_of_text|>",
                        {{"id", "<|begin_of_text|>"},
                         {"ids", {bos}},
                         {"tokens", {"<|begin_of_text|>"}}}}}}}})}};
  auto t = Load(doc);
  ASSERT_NE(t, nullptr);
  EXPECT_THAT(Enc(*t, "hello", /*special=*/true), ElementsAre(bos, Id(*t, "hello")));
  EXPECT_THAT(Enc(*t, "hello", /*special=*/false), ElementsAre(Id(*t, "hello")));
  EXPECT_THAT(Enc(*t, "", /*special=*/true), ElementsAre(bos));
}

TEST(TokenizerTest, Gpt2ByteLevelWithPrefixSpace) {
  json doc = TinyTokenizer();
  doc["normalizer"] = nullptr;
  doc["pre_tokenizer"] = {{"type", "ByteLevel"},
                          {"add_prefix_space", true},
                          {"trim_offsets", true},
                          {"use_regex", true}};
  auto t = Load(doc);
  ASSERT_NE(t, nullptr);
  // " world" is one GPT-2 piece; the prefix space makes "hello" " hello" (no merge for that).
  EXPECT_THAT(Enc(*t, "world"), ElementsAre(Id(*t, " wor"), 'l', 'd'));
  EXPECT_THAT(Enc(*t, "12"), ElementsAre(' ', Id(*t, "12")));  // GPT-2 keeps digit runs
}

TEST(TokenizerTest, LegacyMergeStringsEqualPairs) {
  json pairs = TinyTokenizer();
  json legacy = pairs;
  json strings = json::array({"#version: 0.2"});
  for (const json& m : pairs["model"]["merges"]) {
    strings.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
  }
  legacy["model"]["merges"] = strings;
  auto a = Load(pairs);
  auto b = Load(legacy);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  for (const std::string text : {"hello world", "it's 12 a   b"}) {
    EXPECT_EQ(Enc(*a, text), Enc(*b, text));
  }
}

TEST(TokenizerTest, IgnoreMergesTakesWholeWordsFromTheVocabulary) {
  json doc = TinyTokenizer();
  auto plain = Load(doc);
  doc["model"]["ignore_merges"] = true;
  auto ignoring = Load(doc);
  ASSERT_NE(plain, nullptr);
  ASSERT_NE(ignoring, nullptr);
  EXPECT_THAT(Enc(*plain, "abc"), ElementsAre('a', 'b', 'c'));
  EXPECT_THAT(Enc(*ignoring, "abc"), ElementsAre(*ignoring->token_to_id("abc")));
}

TEST(TokenizerTest, DecodeReplacesInvalidUtf8LikeRust) {
  auto t = Load(TinyTokenizer());
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(*t->Decode({0xE2, 0x82}), "\xEF\xBF\xBD");  // truncated: one U+FFFD
  EXPECT_EQ(*t->Decode({0xE2, 'a'}),
            "\xEF\xBF\xBD"
            "a");
  EXPECT_EQ(*t->Decode({0xFF, 0xC0, 0x80}), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(*t->Decode({0xE2, 0x82, 0xAC}), "\xE2\x82\xAC");  // €
}

TEST(TokenizerTest, ConcurrentEncodesAgree) {
  auto t = Load(TinyTokenizer());
  ASSERT_NE(t, nullptr);
  const std::string text = "hello world, it's 12 o'clock\n\n  hello again";
  const std::vector<int64_t> expected = Enc(*t, text);
  std::vector<std::thread> threads;
  std::vector<bool> ok(4, false);
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      bool all = true;
      for (int k = 0; k < 200; ++k) {
        auto ids = t->Encode(text);
        all &= ids.ok() && *ids == expected;
      }
      ok[i] = all;
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_THAT(ok, ::testing::Each(true));
}

TEST(TokenizerErrorsTest, InvalidUtf8Input) {
  auto t = Load(TinyTokenizer());
  ASSERT_NE(t, nullptr);
  auto ids = t->Encode("ok\xC3(");
  ASSERT_FALSE(ids.ok());
  EXPECT_EQ(ids.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(ids.status().message(), HasSubstr("byte 2"));
  EXPECT_FALSE(t->Encode("\xED\xA0\x80").ok());  // a UTF-8 encoded surrogate
}

// Found by fuzz/tokenizer_json_fuzz.cc: one vocabulary id near 2^31 made the dense id table
// tens of gigabytes; such an id is refused by name instead.
TEST(TokenizerErrorsTest, VocabularyIdFarBeyondTheVocabulary) {
  json doc = TinyTokenizer();
  doc["model"]["vocab"]["abc"] = 2000000000;
  auto t = Tokenizer::FromJson(doc.dump());
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("/model/vocab/abc"));
}

TEST(TokenizerErrorsTest, DecodeNamesTheBadIndex) {
  auto t = Load(TinyTokenizer());
  ASSERT_NE(t, nullptr);
  auto text = t->Decode({104, 1 << 20});
  ASSERT_FALSE(text.ok());
  EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(text.status().message(), HasSubstr("ids[1]"));
  EXPECT_FALSE(t->Decode({-1}).ok());
}

struct BadDocCase {
  const char* name;
  std::function<void(json&)> edit;
  const char* message_part;
};

TEST(TokenizerErrorsTest, UnsupportedComponentsNameTypeAndPath) {
  const std::vector<BadDocCase> cases = {
      {"wordpiece", [](json& d) { d["model"]["type"] = "WordPiece"; }, "/model/type"},
      {"unigram", [](json& d) { d["model"]["type"] = "Unigram"; }, "\"Unigram\""},
      {"metaspace",
       [](json& d) {
         d["pre_tokenizer"]["pretokenizers"][1] = {{"type", "Metaspace"}, {"replacement", "_"}};
       },
       "/pre_tokenizer/pretokenizers/1/type"},
      {"lowercase",
       [](json& d) {
         d["normalizer"] = {{"type", "Lowercase"}};
       },
       "Lowercase"},
      {"nested normalizer",
       [](json& d) {
         d["normalizer"] = {{"type", "Sequence"},
                            {"normalizers", json::array({{{"type", "NFKC"}}})}};
       },
       "/normalizer/normalizers/0/type"},
      {"no byte level", [](json& d) { d["pre_tokenizer"] = nullptr; }, "ByteLevel"},
      {"roberta",
       [](json& d) {
         d["post_processor"] = {{"type", "RobertaProcessing"}};
       },
       "/post_processor/type"},
      {"decoder",
       [](json& d) {
         d["decoder"] = {{"type", "WordPiece"}};
       },
       "/decoder/type"},
      {"dropout", [](json& d) { d["model"]["dropout"] = 0.1; }, "/model/dropout"},
      {"truncation",
       [](json& d) {
         d["truncation"] = {{"max_length", 8}};
       },
       "/truncation"},
      {"merge oov",
       [](json& d) {
         d["model"]["merges"].push_back({"zz", "q"});
       },
       "/model/merges/12"},
      {"bad regex",
       [](json& d) { d["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed"; },
       "/pre_tokenizer/pretokenizers/0/pattern/Regex"},
      {"vocab id", [](json& d) { d["model"]["vocab"]["h"] = "x"; }, "/model/vocab/h"},
  };
  for (const BadDocCase& c : cases) {
    json doc = TinyTokenizer();
    c.edit(doc);
    auto t = Tokenizer::FromJson(doc.dump());
    ASSERT_FALSE(t.ok()) << c.name;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_THAT(t.status().message(), HasSubstr(c.message_part)) << c.name;
  }
  auto not_json = Tokenizer::FromJson("{not json");
  EXPECT_EQ(not_json.status().code(), absl::StatusCode::kInvalidArgument);
  auto missing = Tokenizer::FromFile("/nonexistent/tokenizer.json");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace specwire
