// Which training features an instantiation of a kernel compiles in (its
// `Feats` template argument, a set of the bits below). The feature variant (Variant::mods)
// has them all; a single-feature variant (Variant::mods_bias ... mods_max_logit) has one, so a
// problem with one feature runs code without the others' loads, registers and branches:
// ScoreMod::of leaves the others off, and the compiler drops what would read them. The
// forward-only features (sinks, the max logit) are in the set of a forward kernel only.
// Plain C++: the plan (host) and the kernels (device) agree on the bits.
#pragma once

namespace strideattn::cuda_impl {

inline constexpr int kFeatBias = 1;       // an additive bias (pre or post scale), its dBias
inline constexpr int kFeatSoftcap = 2;    // c tanh(T / c)
inline constexpr int kFeatAlibi = 4;      // -slope |i + s_kv - s_q - j|
inline constexpr int kFeatDropout = 8;    // the Philox keep mask
inline constexpr int kFeatSinks = 16;     // forward: the sink joins each row's denominator
inline constexpr int kFeatMaxLogit = 32;  // forward: the max-logit output
// The features that change the scores (the backward's: Problem::score_feature), and all.
inline constexpr int kScoreFeatures = kFeatBias | kFeatSoftcap | kFeatAlibi | kFeatDropout;
inline constexpr int kFeatAll = kScoreFeatures | kFeatSinks | kFeatMaxLogit;

// The single features, in the order of their variants (Variant::mods_bias + index); a
// backward entry has the first kScoreFeatureCount (sinks alone run the plain passes there).
inline constexpr int kSingleFeatures[] = {kFeatBias, kFeatSoftcap, kFeatAlibi, kFeatDropout, kFeatSinks, kFeatMaxLogit};
inline constexpr int kSingleFeatureCount = 6;
inline constexpr int kScoreFeatureCount = 4;
inline constexpr const char* kSingleFeatureNames[] = {"the bias", "the softcap", "ALiBi",
                                                      "dropout",  "the sinks",   "the max logit"};

}  // namespace strideattn::cuda_impl
