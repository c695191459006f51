#include <array>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "tierswap/detail/config_table.hpp"
#include "tierswap/detail/file.hpp"
#include "tierswap/error.hpp"
#include "tierswap/io_engine.hpp"
#include "tierswap/units.hpp"

#include <fmt/format.h>

namespace tierswap {

std::string_view to_string(IoBackendKind kind) noexcept {
  switch (kind) {
    case IoBackendKind::automatic:
      return "auto";
    case IoBackendKind::uring:
      return "io_uring";
    case IoBackendKind::aio:
      return "libaio";
    case IoBackendKind::posix:
      return "posix";
    case IoBackendKind::service:
      return "service";
  }
  return "?";
}

IoBackendKind parse_backend(std::string_view s) {
  if (s == "auto") return IoBackendKind::automatic;
  if (s == "uring" || s == "io_uring") return IoBackendKind::uring;
  if (s == "aio" || s == "libaio") return IoBackendKind::aio;
  if (s == "posix" || s == "pread") return IoBackendKind::posix;
  throw_invalid("backend", s, "expected auto, uring, aio or posix");
}

void IoEngineConfig::validate() const {
  if (queue_depth < 1 || queue_depth > 4096)
    throw_invalid("queue_depth", std::to_string(queue_depth), "must be in 1..4096");
  if (block_size < 4096 || block_size > 64 * MiB || block_size % 4096 != 0)
    throw_invalid("block_size", std::to_string(block_size),
                  "must be a multiple of 4096 between 4 KiB and 64 MiB");
  if (posix_threads < 1 || posix_threads > 256)
    throw_invalid("posix_threads", std::to_string(posix_threads), "must be in 1..256");
  if (submit_batch > 4096)
    throw_invalid("submit_batch", std::to_string(submit_batch), "must be in 0..4096");
}

namespace {

using Field = detail::ConfigField<IoEngineConfig>;
using C = IoEngineConfig;

// Every setting of IoEngineConfig, in the configuration page's order.
const std::array<Field, 8> kFields = {{
    {"backend", "TIERSWAP_IO_BACKEND", "`auto`", "`auto`, `uring`, `aio`, `posix`",
     [](C& c, const nlohmann::json& v, const std::string& k) {
       c.backend = parse_backend(detail::json_string(v, k));
     },
     [](C& c, const char* n) {
       if (const char* v = std::getenv(n)) c.backend = parse_backend(v);
     }},
    detail::count_field<C, &C::queue_depth>("queue_depth", "TIERSWAP_QUEUE_DEPTH", "32",
                                            "requests in flight (1..4096)"),
    detail::size_field<C, &C::block_size>("block_size", "TIERSWAP_BLOCK_SIZE", "1 MiB",
                                          "largest request (4 KiB..64 MiB, multiple of 4 KiB)"),
    detail::bool_field<C, &C::sqpoll>("sqpoll", "TIERSWAP_SQPOLL", "off", "io_uring SQPOLL thread"),
    detail::count_field<C, &C::sqpoll_idle_ms>("sqpoll_idle_ms", "", "50", "SQPOLL idle time"),
    detail::count_field<C, &C::posix_threads>("posix_threads", "TIERSWAP_POSIX_THREADS", "4",
                                              "workers of the posix backend"),
    detail::count_field<C, &C::max_retries>("max_retries", "TIERSWAP_IO_RETRIES", "64",
                                            "EAGAIN/EINTR/no-progress retries per request"),
    detail::count_field<C, &C::submit_batch>(
        "submit_batch", "TIERSWAP_SUBMIT_BATCH", "2",
        "requests per submission system call (0: all ready at once); at 3 or more Linux merges "
        "requests adjacent on disk into larger ones than `block_size`"),
}};

}  // namespace

IoEngineConfig IoEngineConfig::from_env() {
  return from_env(IoEngineConfig{});
}

std::string IoEngineConfig::file_from_env() {
  const char* path = std::getenv("TIERSWAP_IO_CONFIG");
  return path != nullptr ? path : "";
}

IoEngineConfig IoEngineConfig::from_env(IoEngineConfig c) {
  if (const std::string path = file_from_env(); !path.empty()) {
    const std::string what = fmt::format("TIERSWAP_IO_CONFIG={}", path);
    detail::apply_json<IoEngineConfig>(
        c, kFields, detail::parse_config_object(detail::read_text_file(path, what), what), what);
  }
  detail::apply_env<IoEngineConfig>(c, kFields);
  c.validate();
  return c;
}

IoEngineConfig IoEngineConfig::from_json(std::string_view text) {
  auto c = detail::config_from_json<IoEngineConfig>(text, kFields, "I/O engine config");
  c.validate();
  return c;
}

std::vector<Setting> IoEngineConfig::settings() {
  return detail::settings_of<IoEngineConfig>(kFields);
}

}  // namespace tierswap
