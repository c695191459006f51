// Error helpers shared by every component.
//
// Contract (tools/docs/design.md, "Error handling"): inside io/ hot paths return -errno; at the
// completion boundary a negative result becomes a std::system_error whose message names
// "<op> <path> @<offset>+<len>".
// Invalid configuration and API misuse throw std::invalid_argument naming the key and the value.
#pragma once

#include <cstdint>
#include <exception>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>

namespace tierswap {

/// The exception for a failed I/O: code `err` (a positive errno), message
/// "<op> <path> @<offset>+<length>[: detail]".
std::system_error io_error(int err, std::string_view op, std::string_view path,
                           std::uint64_t offset, std::uint64_t length,
                           std::string_view detail = {});

/// Throws std::invalid_argument("<key>=<value>: <why>").
[[noreturn]] void throw_invalid(std::string_view key, std::string_view value, std::string_view why);

/// Throws std::system_error(errno, "<what>") for a failed system call outside the hot path.
[[noreturn]] void throw_errno(int err, std::string_view what);

/// The message of a caught exception ("unknown error" for one not from std::exception).
std::string what_of(const std::exception_ptr& e);

/// Runs `f`; returns what it threw (null when nothing).
template <class F>
std::exception_ptr thrown_by(F&& f) {
  try {
    f();
  } catch (...) {
    return std::current_exception();
  }
  return nullptr;
}

}  // namespace tierswap
