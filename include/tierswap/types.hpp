// The vocabulary every layer shares, at the bottom of the include order (see the layering test,
// tests/layering.cmake): element types, memory tiers, optimizer kinds. Their functions are
// defined where they are used most (kernels, tier manager, optimizer); this header lets a layer
// name them without including another layer's API.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace tierswap {

enum class Dtype : std::uint8_t { f32, bf16, f16 };
std::string_view to_string(Dtype d) noexcept;
/// "f32"/"fp32"/"float32", "bf16"/"bfloat16", "f16"/"fp16"/"float16"; std::invalid_argument else.
Dtype parse_dtype(std::string_view text);
constexpr std::size_t dtype_size(Dtype d) noexcept {
  return d == Dtype::f32 ? 4 : 2;
}

/// Where a copy of training state lives.
enum class Tier : std::uint8_t { device, host, nvme };
inline constexpr int kTierCount = 3;
/// "gpu" for the device tier (the name the CLI and JSON use), "host", "nvme".
std::string_view to_string(Tier t) noexcept;
/// "gpu" | "device" | "host" | "nvme"; std::invalid_argument otherwise.
Tier parse_tier(std::string_view text);

/// Elements per statistics chunk of a gradient (the unit of the norm's partial sums; partitions
/// and sub-groups are multiples of it).
inline constexpr std::size_t kGradStatsChunk = 8192;
/// Elements per optimizer sub-group unless configured (OptimizerConfig::subgroup_size).
inline constexpr std::uint64_t kDefaultSubgroupSize = 8ull << 20;

enum class OptimizerKind : std::uint8_t { adamw, adam, lion, sgd };
std::string_view to_string(OptimizerKind k) noexcept;
/// "adamw" | "adam" | "lion" | "sgd"; std::invalid_argument otherwise.
OptimizerKind parse_optimizer_kind(std::string_view text);

}  // namespace tierswap
