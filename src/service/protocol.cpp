#include "src/service/protocol.hpp"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <system_error>
#include <utility>

#include <fmt/format.h>

namespace tierswap::service {

const wire::Message* verify_message(const std::uint8_t* data, std::size_t n, std::string* why) {
  if (n < 8 || n > kMaxMessageBytes) {
    *why = fmt::format("message of {} bytes (8..{} allowed)", n, kMaxMessageBytes);
    return nullptr;
  }
  if (!flatbuffers::BufferHasIdentifier(data, wire::MessageIdentifier())) {
    *why = "not a tierswap message (file identifier)";
    return nullptr;
  }
  flatbuffers::Verifier v(data, n, /*max_depth=*/8, /*max_tables=*/16);
  if (!wire::VerifyMessageBuffer(v)) {
    *why = "malformed message (FlatBuffers verifier)";
    return nullptr;
  }
  const wire::Message* m = wire::GetMessage(data);
  if (m->body_type() == wire::Body::NONE || m->body() == nullptr) {
    *why = "message without a body";
    return nullptr;
  }
  if (m->body_type() > wire::Body::MAX) {  // the verifier lets unknown union types through
    *why =
        fmt::format("message of unknown type {} (this side knows 1..{})",
                    static_cast<unsigned>(m->body_type()), static_cast<unsigned>(wire::Body::MAX));
    return nullptr;
  }
  return m;
}

std::string frame(const flatbuffers::FlatBufferBuilder& fb) {
  const std::uint32_t n = fb.GetSize();
  std::string s(4, '\0');
  std::memcpy(s.data(), &n, 4);  // little-endian hosts only (x86-64, aarch64)
  return s.append(reinterpret_cast<const char*>(fb.GetBufferPointer()), n);
}

Connection::Connection(Connection&& o) noexcept
    : sock_(std::exchange(o.sock_, -1)),
      sent_(o.sent_),
      received_(o.received_),
      in_(std::move(o.in_)),
      head_(std::exchange(o.head_, 0)),
      tail_(std::exchange(o.tail_, 0)),
      pending_fd_(std::exchange(o.pending_fd_, -1)),
      out_(std::move(o.out_)),
      out_head_(std::exchange(o.out_head_, 0)),
      broken_(o.broken_.load()) {}

Connection::~Connection() {
  if (sock_ >= 0) ::close(sock_);
  if (pending_fd_ >= 0) ::close(pending_fd_);
}

flatbuffers::Offset<wire::Message> Connection::message(flatbuffers::FlatBufferBuilder& fb,
                                                       wire::Body type,
                                                       flatbuffers::Offset<void> body) {
  return wire::CreateMessage(fb, sent_ + 1, type, body);
}

void Connection::queue(const flatbuffers::FlatBufferBuilder& fb) {
  const std::uint32_t n = fb.GetSize();
  std::uint8_t len[4];
  std::memcpy(len, &n, 4);            // little-endian hosts only (x86-64, aarch64)
  out_.reserve(out_.size() + 4 + n);  // all or nothing: the inserts below cannot throw
  out_.insert(out_.end(), len, len + 4);
  out_.insert(out_.end(), fb.GetBufferPointer(), fb.GetBufferPointer() + n);
  ++sent_;
}

int Connection::write_out(int flags) noexcept {
  while (out_head_ < out_.size()) {
    const ssize_t w =
        ::send(sock_, out_.data() + out_head_, out_.size() - out_head_, MSG_NOSIGNAL | flags);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && (flags & MSG_DONTWAIT)) return 1;
    if (w < 0) {
      const int err = errno;
      break_off(err);  // part of a frame may have gone
      return -err;
    }
    out_head_ += static_cast<std::size_t>(w);
  }
  out_.clear();
  out_head_ = 0;
  return 0;
}

int Connection::flush() noexcept {
  return write_out(0);
}

int Connection::try_flush() noexcept {
  return write_out(MSG_DONTWAIT);
}

int Connection::send(flatbuffers::FlatBufferBuilder& fb, int fd) noexcept {
  if (fd < 0) {
    try {
      queue(fb);
    } catch (...) {
      return -ENOMEM;
    }
    return flush();
  }
  if (const int r = flush(); r != 0) return r;
  const std::uint32_t n = fb.GetSize();
  std::uint8_t len[4];
  std::memcpy(len, &n, 4);  // little-endian hosts only (x86-64, aarch64)
  iovec iov[2] = {{len, 4}, {fb.GetBufferPointer(), n}};
  msghdr mh{};
  mh.msg_iov = iov;
  mh.msg_iovlen = 2;
  alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(int))] = {};
  if (fd >= 0) {
    mh.msg_control = ctl;
    mh.msg_controllen = sizeof ctl;
    cmsghdr* c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
  }
  std::size_t total = 4 + n, done = 0;
  while (done < total) {
    ssize_t w = ::sendmsg(sock_, &mh, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) {
      const int err = errno;
      break_off(err);
      return -err;
    }
    done += static_cast<std::size_t>(w);
    // The descriptor went with the first bytes; send the rest plainly.
    mh.msg_control = nullptr;
    mh.msg_controllen = 0;
    std::size_t skip = static_cast<std::size_t>(w);
    while (mh.msg_iovlen > 0 && skip >= mh.msg_iov[0].iov_len) {
      skip -= mh.msg_iov[0].iov_len;
      ++mh.msg_iov;
      --mh.msg_iovlen;
    }
    if (mh.msg_iovlen > 0) {
      mh.msg_iov[0].iov_base = static_cast<char*>(mh.msg_iov[0].iov_base) + skip;
      mh.msg_iov[0].iov_len -= skip;
    }
  }
  ++sent_;
  return 0;
}

void set_socket_timeout(int fd, double seconds, bool both) noexcept {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(seconds);
  tv.tv_usec = static_cast<suseconds_t>((seconds - std::floor(seconds)) * 1e6);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  if (both) ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

namespace {

// One recvmsg into [p, p + room); a descriptor that comes with it replaces *fd (an earlier one
// is closed: one is ever expected). >0: bytes read, 0: EOF, -errno.
int fill(int sock, std::uint8_t* p, std::size_t room, int* fd) {
  iovec iov{p, room};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(int) * 4)];
  mh.msg_control = ctl;
  mh.msg_controllen = sizeof ctl;
  ssize_t r;
  while ((r = ::recvmsg(sock, &mh, MSG_CMSG_CLOEXEC)) < 0 && errno == EINTR) {
  }
  if (r < 0) return -errno;
  for (cmsghdr* c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const std::size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (std::size_t i = 0; i < k; ++i) {
      int f;
      std::memcpy(&f, CMSG_DATA(c) + i * sizeof(int), sizeof f);
      if (*fd >= 0) ::close(*fd);
      *fd = f;
    }
  }
  return static_cast<int>(r);
}

}  // namespace

// Reads on until the buffer holds a whole frame (its length checked first). 1: it does, 0: EOF
// before any byte of it, -errno (-EPIPE: EOF inside it), or -EMSGSIZE for a length out of bounds.
int Connection::await_frame(std::uint32_t* n) {
  if (in_.empty()) in_.resize(2 * (kMaxMessageBytes + 4));  // room for a whole frame after any
  for (;;) {
    const std::size_t have = tail_ - head_;
    if (have >= 4) {
      std::memcpy(n, in_.data() + head_, 4);  // little-endian hosts only (x86-64, aarch64)
      if (*n < 8 || *n > kMaxMessageBytes) return -EMSGSIZE;
      if (have >= 4 + std::size_t{*n}) return 1;
    }
    if (head_ > 0) {  // the unfinished frame to the front
      std::memmove(in_.data(), in_.data() + head_, have);
      head_ = 0;
      tail_ = have;
    }
    const int r = fill(sock_, in_.data() + tail_, in_.size() - tail_, &pending_fd_);
    if (r == 0) return have == 0 ? 0 : -EPIPE;
    if (r < 0) return r;
    tail_ += static_cast<std::size_t>(r);
  }
}

bool Connection::buffered() const noexcept {
  const std::size_t have = tail_ - head_;
  if (have < 4) return false;
  std::uint32_t n;
  std::memcpy(&n, in_.data() + head_, 4);
  return have >= 4 + std::size_t{n} || n < 8 || n > kMaxMessageBytes;  // a bad one: say so now
}

Connection::Status Connection::receive(std::vector<std::uint8_t>& buf, const wire::Message** msg,
                                       int* fd, std::string* why) {
  if (fd) *fd = -1;
  std::uint32_t n = 0;
  const int r = await_frame(&n);
  if (r == 0) {
    break_off(EPIPE);
    return Status::closed;
  }
  if (r == -EMSGSIZE) {
    *why = fmt::format("message length {} (8..{} allowed)", n, kMaxMessageBytes);
    break_off(EPROTO);
    return Status::invalid;
  }
  if (r < 0) {
    *why = r == -EAGAIN ? kNoAnswerInTime : std::strerror(-r);
    break_off(r == -EAGAIN ? ETIMEDOUT : -r);
    return Status::error;
  }
  buf.assign(in_.begin() + static_cast<std::ptrdiff_t>(head_ + 4),
             in_.begin() + static_cast<std::ptrdiff_t>(head_ + 4 + n));
  head_ += 4 + n;
  // A descriptor goes with the message it came with (a welcome); one nobody asked for is closed.
  const int passed = std::exchange(pending_fd_, -1);
  const wire::Message* m = verify_message(buf.data(), n, why);
  if (m && m->seq() != received_ + 1) {
    *why = fmt::format("message {} out of order (expected {})", m->seq(), received_ + 1);
    m = nullptr;
  }
  if (!m || !fd) {
    if (passed >= 0) ::close(passed);
    if (!m) {
      break_off(EPROTO);
      return Status::invalid;
    }
  } else {
    *fd = passed;
  }
  ++received_;
  *msg = m;
  return Status::ok;
}

std::uint64_t tag_of(const wire::Message& m) {
  switch (m.body_type()) {
    case wire::Body::Sync:
      return m.body_as_Sync()->tag();
    case wire::Body::Read:
      return m.body_as_Read()->tag();
    case wire::Body::Write:
      return m.body_as_Write()->tag();
    default:
      return 0;
  }
}

void build_reply(Connection& c, flatbuffers::FlatBufferBuilder& fb, const Answer& a) {
  const auto msg = fb.CreateString(a.message);
  const auto txt = fb.CreateString(a.text);
  const auto body = wire::CreateReply(fb, a.error, msg, a.value, txt, a.tag);
  fb.Finish(c.message(fb, wire::Body::Reply, body.Union()), wire::MessageIdentifier());
}

Answer error_answer(std::exception_ptr err, std::uint64_t tag) {
  try {
    std::rethrow_exception(std::move(err));
  } catch (const std::system_error& e) {
    return {e.code().value() ? e.code().value() : EIO, e.what(), 0, {}, tag};
  } catch (const std::exception& e) {
    return {EIO, e.what(), 0, {}, tag};
  } catch (...) {
    return {EIO, "unknown error", 0, {}, tag};
  }
}

}  // namespace tierswap::service
