// The node service's wire: length-prefixed, versioned, verified FlatBuffers messages over a Unix
// stream socket (schema: protocol.fbs), with a memfd passed by SCM_RIGHTS beside one of them.
// Used by both ends; nothing here trusts the peer: every received message is bounded, verified
// (flatbuffers::Verifier, file identifier) and in sequence before anyone reads a field.
#pragma once

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "src/service/protocol_generated.h"

namespace tierswap::service {

inline constexpr std::uint32_t kProtocolVersion = 3;  // 2: pageable shared memory; 3: Offer
/// Largest message accepted (the length prefix excluded): control messages are small.
inline constexpr std::uint32_t kMaxMessageBytes = 64 * 1024;

/// A finished message as it goes on the wire: the little-endian u32 length, then the buffer
/// (what Connection::send writes; tests and fuzz seeds build raw streams from it).
std::string frame(const flatbuffers::FlatBufferBuilder& fb);

/// What receive() says when the socket's receive timeout ran out.
inline constexpr const char* kNoAnswerInTime = "no answer within the timeout";

/// SO_RCVTIMEO (with `both`, SO_SNDTIMEO too) of `seconds` on a socket; 0: none.
void set_socket_timeout(int fd, double seconds, bool both = false) noexcept;

/// Verifies one message (without its length prefix). Returns it, or nullptr with `*why` set.
const wire::Message* verify_message(const std::uint8_t* data, std::size_t n, std::string* why);

/// One end of a connection: owns the socket, numbers what it sends and checks the numbers of
/// what it receives. Move-only; closes the socket when destroyed.
class Connection {
 public:
  explicit Connection(int sock) noexcept : sock_(sock) {}
  Connection(Connection&& o) noexcept;
  Connection& operator=(Connection&&) = delete;
  Connection(const Connection&) = delete;
  ~Connection();

  int fd() const noexcept { return sock_; }
  /// A FlatBufferBuilder with the next sequence number: finish the body, then send().
  flatbuffers::Offset<wire::Message> message(flatbuffers::FlatBufferBuilder& fb, wire::Body type,
                                             flatbuffers::Offset<void> body);
  /// Sends the finished message (after any queued output), with `fd` as SCM_RIGHTS when >= 0.
  /// 0 or -errno.
  int send(flatbuffers::FlatBufferBuilder& fb, int fd = -1) noexcept;
  /// Appends the finished message to the output, which flush() or try_flush() sends in order:
  /// several messages in one write.
  void queue(const flatbuffers::FlatBufferBuilder& fb);
  /// Sends all queued output, blocking as the socket does (its send timeout). 0 or -errno.
  int flush() noexcept;
  /// Sends what the socket takes now without blocking: 0 when all went, 1 when some is left,
  /// or -errno.
  int try_flush() noexcept;
  bool has_output() const noexcept { return out_head_ < out_.size(); }

  enum class Status { ok, closed, error, invalid };
  /// Receives one message into `buf` (verified and in sequence: `*msg` then points into `buf`).
  /// A passed descriptor lands in `*fd` (else -1; one is closed when fd is null). On invalid or
  /// error, `*why` says what was wrong.
  Status receive(std::vector<std::uint8_t>& buf, const wire::Message** msg, int* fd,
                 std::string* why);
  /// True when the next receive() needs no read from the socket: a whole message (or a length
  /// that is refused at once) already waits in the buffer, which poll() on fd() does not see.
  /// receive() reads as much as the socket has, so requests and answers sent back to back
  /// arrive with one read.
  bool buffered() const noexcept;
  /// 0, or the errno with which the connection stopped being usable: a receive that failed or
  /// timed out (an answer may still arrive, out of step with the next request), a send that
  /// failed, or break_off(). Nothing is sent or received on it after that.
  int broken() const noexcept { return broken_.load(); }
  void break_off(int err) noexcept {
    int none = 0;
    broken_.compare_exchange_strong(none, err ? err : EIO);
  }

 private:
  int await_frame(std::uint32_t* n);
  int write_out(int flags) noexcept;
  int sock_ = -1;
  std::uint64_t sent_ = 0, received_ = 0;
  std::vector<std::uint8_t> in_;  // received bytes: in_[head_, tail_) not yet taken
  std::size_t head_ = 0, tail_ = 0;
  int pending_fd_ = -1;            // a descriptor received with bytes not yet taken
  std::vector<std::uint8_t> out_;  // queued frames: out_[out_head_, end) not yet sent
  std::size_t out_head_ = 0;
  std::atomic<int> broken_{0};
};

/// What a Reply carries: `error` (0 or errno) with its `message`, or a `value` and `text`; `tag`
/// names the request it answers (raw I/O and Sync; 0 for the others).
struct Answer {
  int error = 0;
  std::string message;
  std::uint64_t value = 0;
  std::string text;
  std::uint64_t tag = 0;
};

/// The Answer to a failed request: a std::system_error's code (EIO if it has none) or EIO, and
/// the exception's message.
Answer error_answer(std::exception_ptr err, std::uint64_t tag = 0);

/// The tag a request carries for its answer (Read, Write, Sync; 0 for the others).
std::uint64_t tag_of(const wire::Message& m);

/// Builds `a` as the next message of `c` in `fb` (finished, not sent).
void build_reply(Connection& c, flatbuffers::FlatBufferBuilder& fb, const Answer& a);

}  // namespace tierswap::service
