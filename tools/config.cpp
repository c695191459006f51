// `tierswap config --from-deepspeed FILE`: what a DeepSpeed config becomes in tierswap. The
// mapping has one owner, the Python package (tierswap/deepspeed.py, also behind
// tierswap.torch.from_deepspeed_config); this command runs it with the package found beside the
// CLI: build/python in a build tree, <prefix>/TIERSWAP_PYTHON_INSTALL_DIR when installed.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

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

}  // namespace

void add_config(CLI::App& app) {
  auto* cmd = app.add_subcommand("config", "Configuration: map a DeepSpeed config to tierswap's");
  auto file = std::make_shared<std::string>();
  cmd->add_option("--from-deepspeed", *file,
                  "A DeepSpeed config (JSON): prints the tierswap.torch optimizer and keywords; "
                  "keys without an equivalent are named in a warning")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->callback([file] { run_mapping(*file); });
}

}  // namespace tierswap::cli
