// One setting of a configuration struct, as the struct's settings table declares it.
#pragma once

#include <string>
#include <vector>

namespace tierswap {

/// A setting of IoEngineConfig, SwapSpaceConfig, TierConfig, OptimizerConfig or ProcessConfig
/// (each struct's settings()): its JSON key, its environment variable ("" when it has none), its
/// default and what it does, the last two as the documentation shows them (Markdown).
struct Setting {
  std::string key;
  std::string env;
  std::string shown_default;
  std::string meaning;
};

/// The settings as the configuration page's Markdown table: a header, then one row each,
/// "| `key` | `ENV` | default | meaning |" ("—" for no variable). `tierswap config --settings`
/// prints every struct's, and the page's table is that output.
std::string settings_markdown(const std::vector<Setting>& settings);

}  // namespace tierswap
