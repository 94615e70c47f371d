#include "common/contract.h"

#include <gtest/gtest.h>

namespace specwire {
namespace {

CanaryFingerprint Canary(double scale, const std::string& dtype = "float32") {
  CanaryFingerprint c;
  c.token_ids = CanaryTokens(2048, 4);
  c.compute_dtype = dtype;
  c.taps = {{"embedding", 0.01, 0.5, 0.5, {0.4, -0.6, 0.5}},
            {"layer.0", 0.02 * scale, 1.0 * scale, 1.0 * scale, {0.9 * scale, -1.1, 1.0}}};
  return c;
}

TEST(CanaryTest, TokensSpreadOverTheVocabulary) {
  EXPECT_EQ(CanaryTokens(2048, 3), (std::vector<int64_t>{11, 7930 % 2048, 15849 % 2048}));
  EXPECT_TRUE(CanaryTokens(0, 3).empty());
}

TEST(CanaryTest, JsonRoundTripInsideTheContract) {
  ExtractionContract c;
  c.architecture = "Qwen3ForCausalLM";
  c.canary = Canary(1.0);
  c.canary.taps[1].sketch[0] = 1.0 / 3;  // exact doubles survive
  auto back = ContractFromJson(ContractToJson(c));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->canary, c.canary);
  auto canary = CanaryFromJson(ContractToJson(c));  // the canary of a whole contract
  ASSERT_TRUE(canary.ok());
  EXPECT_EQ(*canary, c.canary);
  EXPECT_FALSE(CanaryFromJson("[1]").ok());
  EXPECT_FALSE(CanaryFromJson(R"({"canary": {"taps": 3}})").ok());
  // Contracts written before the canary existed still parse.
  auto old = ContractFromJson(R"({"architecture":"a","model_type":"m","source_layout":"text",
    "source_architecture":"a","weight_prefix":"model.","tensors_loaded":1,"tensors_skipped":0,
    "skipped":[],"num_layers":1,"hidden_size":2,"vocab_size":3,"layer_types":["full_attention"],
    "compute_dtype":"float32","devices":["cpu"],"kernel_variant":"k","weights_digest":"w",
    "tokenizer_digest":"","specwire_version":"v"})");
  ASSERT_TRUE(old.ok()) << old.status();
  EXPECT_TRUE(old->canary.empty());
}

TEST(CanaryTest, ComparisonLevels) {
  EXPECT_EQ(CompareFingerprints(Canary(1.0), Canary(1.0)).level, "identical");
  const FingerprintComparison rounding = CompareFingerprints(Canary(1.0), Canary(1.0 + 3e-6));
  EXPECT_EQ(rounding.level, "rounding");
  EXPECT_EQ(rounding.taps[0].level, "identical");
  EXPECT_EQ(CompareFingerprints(Canary(1.0), Canary(1.0 + 3e-4)).level, "drift");
  EXPECT_EQ(CompareFingerprints(Canary(1.0), Canary(1.1)).level, "mismatch");
  // bfloat16 on either side widens the rounding threshold.
  const FingerprintComparison bf16 = CompareFingerprints(Canary(1.0), Canary(1.01, "bfloat16"));
  EXPECT_EQ(bf16.level, "rounding");
  EXPECT_DOUBLE_EQ(bf16.threshold, 2e-2);
  CanaryFingerprint other = Canary(1.0);
  other.token_ids.push_back(1);
  EXPECT_EQ(CompareFingerprints(Canary(1.0), other).level, "mismatch");
  EXPECT_FALSE(CompareFingerprints(Canary(1.0), other).problem.empty());
  EXPECT_EQ(CompareFingerprints(Canary(1.0), CanaryFingerprint{}).level, "mismatch");
}

}  // namespace
}  // namespace specwire
