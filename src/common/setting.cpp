// The configuration page's table from the structs' settings (setting.hpp).
#include "tierswap/setting.hpp"

namespace tierswap {

std::string settings_markdown(const std::vector<Setting>& settings) {
  std::string out = "| key (JSON) | env | default | meaning |\n|---|---|---|---|\n";
  for (const auto& s : settings) {
    const std::string env = s.env.empty() ? "—" : "`" + s.env + "`";
    out += "| `" + s.key + "` | " + env + " | " + s.shown_default + " | " + s.meaning + " |\n";
  }
  return out;
}

}  // namespace tierswap
