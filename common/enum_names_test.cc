#include "common/enum_names.h"

#include <gtest/gtest.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "common/model_config.h"
#include "common/safetensors.h"
#include "common/status_testing.h"

namespace specwire {
namespace {

enum class Color { kRed, kGreen, kBlue };
constexpr EnumName<Color> kColorNames[] = {
    {Color::kRed, "red"}, {Color::kGreen, "green"}, {Color::kBlue, "blue"}};

TEST(EnumNames, BothWaysFromOneTable) {
  for (const EnumName<Color>& n : kColorNames) {
    EXPECT_STREQ(NameOf(kColorNames, n.value), n.name);
    EXPECT_EQ(ValueOf(kColorNames, n.name), n.value);
  }
  EXPECT_EQ(ValueOf(kColorNames, "Red"), std::nullopt);  // names are exact
  EXPECT_EQ(ValueOf(kColorNames, ""), std::nullopt);
  EXPECT_EQ(NamesOf(kColorNames, ", "), "red, green, blue");
  // A value no row names (cast from an int off the wire) gets the fallback, never a crash.
  EXPECT_STREQ(NameOf(kColorNames, static_cast<Color>(7)), "?");
  EXPECT_STREQ(NameOf(kColorNames, static_cast<Color>(7), "UNKNOWN"), "UNKNOWN");
  static_assert(NameOf(kColorNames, Color::kGreen)[0] == 'g');  // usable at compile time
}

TEST(EnumNames, DTypeNamesRoundTripAndTheErrorListsThem) {
  for (DType d : {DType::kBF16, DType::kF16, DType::kF32, DType::kI64, DType::kBool}) {
    ASSERT_TRUE(ParseDTypeName(DTypeName(d)).ok()) << DTypeName(d);
    EXPECT_EQ(*ParseDTypeName(DTypeName(d)), d);
  }
  ExpectError(ParseDTypeName("F64").status(), absl::StatusCode::kInvalidArgument,
              {"\"F64\"", "BF16, F16, F32, I64, BOOL"});
}

TEST(EnumNames, LayerTypesReadAsTheyAreWritten) {
  for (LayerType t :
       {LayerType::kFullAttention, LayerType::kSlidingAttention, LayerType::kLinearAttention}) {
    const std::string config = absl::StrCat(
        R"({"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "vocab_size": 32,
            "hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": 1,
            "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8,
            "sliding_window": 4, "layer_types": [")",
        LayerTypeName(t), R"("]})");
    auto parsed = ParseModelConfig(config);
    if (t == LayerType::kLinearAttention) {
      // A dense family has no linear-attention layers: refused, naming the type it read.
      ASSERT_FALSE(parsed.ok());
      EXPECT_NE(parsed.status().message().find("linear_attention"), std::string::npos);
      continue;
    }
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(parsed->layer_types.at(0), t);
  }
  auto bad = ParseModelConfig(
      R"({"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "vocab_size": 32,
          "hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": 1,
          "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8,
          "layer_types": ["full"]})");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("full_attention, sliding_attention, linear_attention"),
            std::string::npos)
      << bad.status();
}

}  // namespace
}  // namespace specwire
