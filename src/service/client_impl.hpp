// ServiceClient's internals (internal): the connection, the mapped shared memory and the
// answers to hello; ServiceStorage's backend takes the connection over for raw I/O.
#pragma once

#include <sys/mman.h>
#include <sys/socket.h>

#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include "src/service/protocol.hpp"
#include "tierswap/service.hpp"

#include <fmt/format.h>

namespace tierswap {

using service::Connection;

struct ServiceClient::Impl {
  ServiceClientConfig cfg;
  std::filesystem::path path;
  std::unique_ptr<Connection> conn;
  std::byte* data = nullptr;
  std::uint64_t bytes = 0;  // mapped: locked_bytes, then the pageable part
  std::uint64_t locked_bytes = 0;
  std::uint64_t generation = 0;
  bool reattached = false;
  std::uint32_t alignment = 4096;
  std::uint64_t region_bytes = 0;
  std::string space_uuid;
  std::vector<std::uint8_t> buf;
  flatbuffers::FlatBufferBuilder fb;

  [[noreturn]] void fail(int err, const std::string& what) const {
    throw std::system_error(err, std::system_category(),
                            fmt::format("tierswap service {}: {}", path.string(), what));
  }
  void connect();
  void attach();
  // Sends the finished message and returns the verified answer (a Reply unless `welcome`).
  // `closed`: what a connection closed instead of an answer means here.
  const wire::Message& exchange(int* fd = nullptr, const char* closed = "closed the connection");
  const wire::Reply& request(wire::Body type, flatbuffers::Offset<void> body, const char* what);
  // An orderly goodbye: the service answers the end of our stream by detaching this client
  // (freeing its memory, ending its attachment) and only then closing its side, so waiting for
  // that close (at most the receive timeout) lets the same job + rank attach again at once.
  // A connection that already failed (a service that stopped answering) is closed at once.
  ~Impl() {
    if (conn && conn->fd() >= 0 && conn->broken() == 0 && ::shutdown(conn->fd(), SHUT_WR) == 0) {
      char sink[256];
      while (::recv(conn->fd(), sink, sizeof sink, 0) > 0) {
      }
    }
    if (data) ::munmap(data, bytes);
  }
};

}  // namespace tierswap
