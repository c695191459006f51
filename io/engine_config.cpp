#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "tierswap/detail/env.hpp"
#include "tierswap/error.hpp"
#include "tierswap/io_engine.hpp"
#include "tierswap/units.hpp"

#include <fmt/format.h>
#include "tierswap/detail/json.hpp"

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
}

using detail::env_u64;

IoEngineConfig IoEngineConfig::from_env() {
  return from_env(IoEngineConfig{});
}

IoEngineConfig IoEngineConfig::from_env(IoEngineConfig c) {
  if (const char* v = std::getenv("TIERSWAP_IO_BACKEND")) c.backend = parse_backend(v);
  c.queue_depth = static_cast<std::uint32_t>(env_u64("TIERSWAP_QUEUE_DEPTH", c.queue_depth, false));
  c.block_size = env_u64("TIERSWAP_BLOCK_SIZE", c.block_size, true);
  c.sqpoll = detail::env_bool("TIERSWAP_SQPOLL", c.sqpoll);
  c.posix_threads =
      static_cast<std::uint32_t>(env_u64("TIERSWAP_POSIX_THREADS", c.posix_threads, false));
  c.max_retries = static_cast<std::uint32_t>(env_u64("TIERSWAP_IO_RETRIES", c.max_retries, false));
  c.validate();
  return c;
}

IoEngineConfig IoEngineConfig::from_json(std::string_view text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw std::invalid_argument(fmt::format("I/O engine config: invalid JSON: {}", e.what()));
  }
  if (!j.is_object()) throw std::invalid_argument("I/O engine config: expected a JSON object");
  IoEngineConfig c;
  auto uint_of = [](const nlohmann::json& v, const std::string& key) -> std::uint64_t {
    if (!v.is_number_unsigned()) throw_invalid(key, v.dump(), "expected a non-negative integer");
    return detail::json_int<std::uint64_t>(v);
  };
  for (auto& [key, v] : j.items()) {
    if (key == "backend") {
      if (!v.is_string()) throw_invalid(key, v.dump(), "expected a string");
      c.backend = parse_backend(v.get<std::string>());
    } else if (key == "queue_depth") {
      c.queue_depth =
          static_cast<std::uint32_t>(std::min<std::uint64_t>(uint_of(v, key), 1u << 30));
    } else if (key == "block_size") {
      c.block_size = v.is_string() ? parse_size(v.get<std::string>(), key) : uint_of(v, key);
    } else if (key == "sqpoll") {
      if (!v.is_boolean()) throw_invalid(key, v.dump(), "expected true or false");
      c.sqpoll = v.get<bool>();
    } else if (key == "sqpoll_idle_ms") {
      c.sqpoll_idle_ms = static_cast<std::uint32_t>(uint_of(v, key));
    } else if (key == "posix_threads") {
      c.posix_threads =
          static_cast<std::uint32_t>(std::min<std::uint64_t>(uint_of(v, key), 1u << 30));
    } else if (key == "max_retries") {
      c.max_retries = static_cast<std::uint32_t>(uint_of(v, key));
    } else {
      throw_invalid(key, v.dump(),
                    "unknown I/O engine config key (known: backend, queue_depth, block_size, "
                    "sqpoll, sqpoll_idle_ms, posix_threads, max_retries)");
    }
  }
  c.validate();
  return c;
}

}  // namespace tierswap
