// Backend choice: a forced backend must start; otherwise io_uring, then libaio, then posix, and
// the reasons for every skip end up in the engine's description.
#include <sys/resource.h>

#include <cstring>
#include <string>
#include <system_error>

#include "tierswap/detail/io_backend.hpp"
#include "tierswap/log.hpp"
#include "tierswap/units.hpp"

#include <fmt/format.h>

namespace tierswap::detail {

std::unique_ptr<IoBackend> choose_backend(IoBackendKind wanted, const BackendParams& p,
                                          std::string* description) {
  using Maker = std::unique_ptr<IoBackend> (*)(const BackendParams&, int*, std::string*);
  struct Candidate {
    IoBackendKind kind;
    Maker make;
  };
  const Candidate all[] = {{IoBackendKind::uring, &make_uring_backend},
                           {IoBackendKind::aio, &make_aio_backend},
                           {IoBackendKind::posix, &make_posix_backend}};
  std::string skipped;
  for (const auto& c : all) {
    if (wanted != IoBackendKind::automatic && wanted != c.kind) continue;
    int err = 0;
    std::string why;
    auto b = c.make(p, &err, &why);
    if (b) {
      std::string d = fmt::format("{} ({})", to_string(c.kind), b->describe());
      if (wanted != IoBackendKind::automatic) d += ", forced";
      if (!skipped.empty()) d += "; skipped " + skipped;
      *description = d;
      return b;
    }
    if (wanted != IoBackendKind::automatic)
      throw std::system_error(
          -err, std::system_category(),
          fmt::format("I/O backend {} was forced but cannot start: {}", to_string(c.kind), why));
    std::string s = fmt::format("{}: {}", to_string(c.kind), why);
    log(LogLevel::warn, "I/O backend " + s + "; trying the next one");
    skipped += skipped.empty() ? s : "; " + s;
  }
  throw std::system_error(ENOSYS, std::system_category(), "no I/O backend could start: " + skipped);
}

}  // namespace tierswap::detail
