// What the node service answers a client, end to end: a fake service on a scratch socket reads the
// client's first message, sends the input as its answer (length prefixes, FlatBuffers, sequence
// numbers) and closes. Selector 0: the answer to an Offer (service_offer). Selector 1: the answer
// to a Hello (ServiceClient's constructor). Selector 2: the same with a 64 KiB memfd passed beside
// it, as a Welcome's shared memory is. Selector 3: the answer to a Status (service_regions, the
// JSON list `tierswap release --older-than` acts on). A bad answer is a std::exception naming the
// socket; never a crash, a hang, or a mapping past the memfd.
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <thread>

#include "fuzz_util.hpp"
#include "tierswap/service.hpp"

using namespace tierswap;

namespace {

constexpr std::size_t kMemfdBytes = 64 << 10;

int listener(const std::filesystem::path& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strcpy(a.sun_path, path.c_str());
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd, 4) != 0)
    std::abort();
  return fd;
}

int shared_memory() {
  const int fd = ::memfd_create("fuzz-welcome", MFD_CLOEXEC);
  if (fd < 0 || ::ftruncate(fd, kMemfdBytes) != 0) std::abort();
  return fd;
}

// One connection: the client's request read, `answer` sent (with `memfd` beside its first byte
// when >= 0), then closed.
void answer_once(int listen_fd, std::string_view answer, int memfd) {
  const int c = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
  if (c < 0) std::abort();
  char request[4096];
  (void)!::recv(c, request, sizeof request, 0);
  std::size_t sent = 0;
  if (memfd >= 0 && !answer.empty()) {
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    iovec iov{const_cast<char*>(answer.data()), 1};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    cmsghdr* cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(cm), &memfd, sizeof(int));
    if (::sendmsg(c, &msg, MSG_NOSIGNAL) == 1) sent = 1;
  }
  while (sent < answer.size()) {
    const ssize_t w = ::send(c, answer.data() + sent, answer.size() - sent, MSG_NOSIGNAL);
    if (w <= 0) break;
    sent += static_cast<std::size_t>(w);
  }
  ::shutdown(c, SHUT_WR);
  while (::recv(c, request, sizeof request, 0) > 0) {
  }  // the client's goodbye, if it got that far
  ::close(c);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t n) {
  static const std::filesystem::path socket = fuzz::scratch() / "answers.sock";
  static const int listen_fd = listener(socket);
  static const int memfd = shared_memory();
  const auto [which, answer] = fuzz::split(data, n);
  const int mode = which % 4;
  std::thread service(answer_once, listen_fd, answer, mode == 2 ? memfd : -1);
  try {
    if (mode == 0) {
      (void)service_offer(socket, 2, 5);
    } else if (mode == 3) {
      for (const ServiceRegion& r : service_regions(socket, 5))
        if (r.key().empty() || r.idle_seconds < 0) std::abort();  // checked as it was read
    } else {
      ServiceClientConfig cc;
      cc.socket = socket;
      cc.job = "fuzz";
      cc.memory_bytes = kMemfdBytes;
      cc.region_bytes = 1 << 20;
      cc.timeout_seconds = 5;
      cc.raw = true;
      ServiceClient c(cc);
      std::memset(c.memory().data(), 0x5a, c.memory().size());  // all of it is mapped
    }
  } catch (const std::exception&) {
  }
  service.join();
  return 0;
}
