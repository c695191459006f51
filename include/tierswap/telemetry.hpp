// Telemetry endpoint: a live tierswap process serves its residency snapshot (JSON) on a
// Unix-domain socket "<runtime dir>/<pid>.sock" (mode 0600, in a 0700 directory owned by the
// user; a connecting peer of another uid is refused via SO_PEERCRED). The protocol is one
// exchange: connect, read the JSON document until EOF. Every TelemetryServer of a process shares
// that one socket (two optimizers in one process): it answers with the document of the only
// server, else {"pid": P, "sources": [document, ...]} in the order they were made, and stays
// while any of them lives.
//
// Runtime directory: TIERSWAP_RUNTIME_DIR (an absolute path), else $XDG_RUNTIME_DIR/tierswap
// (when absolute, as the XDG specification asks), else /tmp/tierswap-<uid>.
// TIERSWAP_TELEMETRY=0 turns the endpoint off.
#pragma once

#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace tierswap {

struct TelemetryConfig {
  bool enabled = true;
  std::filesystem::path runtime_dir;  ///< empty: default_runtime_dir()
  /// Overrides from TIERSWAP_TELEMETRY (0|1) and TIERSWAP_RUNTIME_DIR.
  static TelemetryConfig from_env();
};

/// The runtime directory tierswap processes publish their sockets in (see the header comment); a
/// relative TIERSWAP_RUNTIME_DIR is std::invalid_argument.
std::filesystem::path default_runtime_dir();

/// Serves `snapshot()` to every accepted same-uid connection, on the process's telemetry thread,
/// until destroyed (the last server of the process stops the thread and removes the socket). Throws
/// std::system_error naming the path when the directory or socket cannot be set up safely (e.g. a
/// directory owned by someone else, or group/world-writable).
class TelemetryServer {
 public:
  TelemetryServer(std::function<std::string()> snapshot, TelemetryConfig cfg);
  ~TelemetryServer();
  TelemetryServer(const TelemetryServer&) = delete;
  TelemetryServer& operator=(const TelemetryServer&) = delete;
  const std::filesystem::path& socket_path() const noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct LiveProcess {
  int pid = 0;
  std::filesystem::path socket;
  std::string command;  ///< from /proc/PID/cmdline
};

/// Sockets in `runtime_dir` whose process is alive, by pid. Stale sockets of dead processes owned
/// by this user are removed.
std::vector<LiveProcess> list_live_processes(const std::filesystem::path& runtime_dir);

/// Connects to a telemetry socket and returns the JSON it sends. Throws std::system_error
/// naming the socket when it cannot connect or read, and ETIMEDOUT when no whole answer came
/// within `timeout_seconds` (a socket that is not a telemetry socket, such as a node service's,
/// or a stopped process: the message names the pid that listens there).
std::string query_telemetry(const std::filesystem::path& socket, double timeout_seconds = 10);

}  // namespace tierswap
