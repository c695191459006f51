// `tierswap config --settings`: every setting of the five config structs as the configuration
// page's table. `tierswap config --from-deepspeed FILE`: what a DeepSpeed config becomes in
// tierswap. The mapping has one owner, the Python package (tierswap/deepspeed.py, also behind
// tierswap.torch.from_deepspeed_config); this command runs it with the package found beside the
// CLI: build/python in a build tree, <prefix>/TIERSWAP_PYTHON_INSTALL_DIR when installed.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include "tierswap/io_engine.hpp"
#include "tierswap/optimizer.hpp"
#include "tierswap/process_config.hpp"
#include "tierswap/setting.hpp"
#include "tierswap/swap_space.hpp"
#include "tierswap/tier_manager.hpp"
#include "tierswap/tiered_optimizer.hpp"
#include "tools/commands.hpp"

namespace tierswap::cli {
namespace {

std::filesystem::path package_dir() {
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) throw std::runtime_error("config: cannot locate the tierswap executable");
  const auto bin = exe.parent_path();
  std::vector<std::filesystem::path> dirs = {bin / "python"};
#ifdef TIERSWAP_PYTHON_INSTALL_DIR
  dirs.push_back(bin / ".." / TIERSWAP_PYTHON_INSTALL_DIR);
#endif
  for (const auto& dir : dirs)
    if (std::filesystem::exists(dir / "tierswap" / "deepspeed.py", ec)) return dir;
  throw std::runtime_error(
      "config: the tierswap Python package is not beside this executable (build with "
      "TIERSWAP_BUILD_PYTHON, or install it)");
}

[[noreturn]] void run_mapping(const std::string& file) {
  const char* env = std::getenv("TIERSWAP_PYTHON");
  const std::string python = env != nullptr && *env != '\0' ? env : "/usr/bin/python3";
  std::string path = package_dir().string();
  if (const char* old = std::getenv("PYTHONPATH"); old != nullptr && *old != '\0')
    path += std::string(":") + old;
  ::setenv("PYTHONPATH", path.c_str(), 1);
  std::vector<const char*> argv = {python.c_str(), "-m", "tierswap.deepspeed", file.c_str(),
                                   nullptr};
  ::execv(python.c_str(), const_cast<char* const*>(argv.data()));
  throw std::runtime_error("config: cannot run " + python + " (set TIERSWAP_PYTHON)");
}

// Every struct's settings, in the configuration page's order.
void print_settings() {
  std::vector<Setting> all;
  for (auto part :
       {IoEngineConfig::settings(), SwapSpaceConfig::settings(), TierConfig::settings(),
        NodeServiceConfig::settings(), OptimizerConfig::settings(), ProcessConfig::settings()})
    all.insert(all.end(), part.begin(), part.end());
  std::fputs(settings_markdown(all).c_str(), stdout);
}

}  // namespace

void add_config(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "config", "Configuration: every setting, or a DeepSpeed config mapped to tierswap's");
  auto file = std::make_shared<std::string>();
  auto* from = cmd->add_option("--from-deepspeed", *file,
                               "A DeepSpeed config (JSON): prints the tierswap.torch optimizer and "
                               "keywords; keys without an equivalent are named in a warning")
                   ->check(CLI::ExistingFile);
  auto settings = std::make_shared<bool>(false);
  auto* table = cmd->add_flag("--settings", *settings,
                              "Print every setting (JSON key, environment variable, default, "
                              "meaning) as a Markdown table");
  from->excludes(table);
  cmd->require_option(1);
  cmd->callback([file, settings] {
    if (*settings)
      print_settings();
    else
      run_mapping(*file);
  });
}

}  // namespace tierswap::cli
