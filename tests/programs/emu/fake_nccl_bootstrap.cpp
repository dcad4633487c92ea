// The stand-in NCCL's bootstrap: rank 0 listens on an abstract Unix socket named from the communicator's unique id,
// the other ranks connect to it, and rank 0 relays every exchange (descriptors too, with SCM_RIGHTS), as NCCL's
// bootstrap and proxy carry the ranks' information and cuMem POSIX FDs.
#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstring>
#include <thread>

#include "fake_nccl_internal.hpp"

namespace fake_nccl {
namespace {

using clock = std::chrono::steady_clock;

constexpr auto connect_deadline = std::chrono::seconds(60);  // for the last rank to start
// How long an exchange waits for a peer: long, since a peer may be held for a checkpoint in the middle of one.
constexpr int exchange_timeout_ms = 300'000;
constexpr int max_fds = 2;
constexpr std::uint64_t hello_magic = 0x66616b656e63636cULL;  // "fakenccl"

struct hello {
  std::uint64_t magic = hello_magic;
  int rank = 0;
  int nranks = 0;
};

std::uint64_t fnv1a(const std::string& s) {
  std::uint64_t h = 1469598103934665603ULL;
  for (unsigned char ch : s) h = (h ^ ch) * 1099511628211ULL;
  return h;
}

// The abstract socket of a communicator: its name hashed, so that ids of splits of splits still fit.
socklen_t socket_address(const std::string& name, sockaddr_un& address) {
  address = sockaddr_un{};
  address.sun_family = AF_UNIX;
  char text[64];
  const int n =
      std::snprintf(text, sizeof text, "vmmckpt-fake-nccl-%016llx", static_cast<unsigned long long>(fnv1a(name)));
  std::memcpy(address.sun_path + 1, text, static_cast<std::size_t>(n));  // sun_path[0] == 0: abstract
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + static_cast<std::size_t>(n));
}

bool send_message(int sock, const void* data, std::size_t bytes, const int* fds, int nfds) {
  iovec io{const_cast<void*>(data), bytes};
  msghdr msg{};
  msg.msg_iov = &io;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * max_fds)] = {};
  if (nfds > 0) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * static_cast<std::size_t>(nfds));
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * static_cast<std::size_t>(nfds));
    std::memcpy(CMSG_DATA(c), fds, sizeof(int) * static_cast<std::size_t>(nfds));
  }
  for (;;) {
    const ssize_t n = sendmsg(sock, &msg, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    return n == static_cast<ssize_t>(bytes);
  }
}

bool wait_readable(int sock, int timeout_ms) {
  pollfd p{sock, POLLIN, 0};
  for (;;) {
    const int n = poll(&p, 1, timeout_ms);
    if (n < 0 && errno == EINTR) continue;
    return n > 0;
  }
}

// One message of exactly `bytes` bytes and `nfds` descriptors; false on timeout, end or a message of another shape
// (whatever descriptors came are closed).
bool receive_message(int sock, void* data, std::size_t bytes, int* fds, int nfds, int timeout_ms) {
  if (!wait_readable(sock, timeout_ms)) return false;
  iovec io{data, bytes};
  msghdr msg{};
  msg.msg_iov = &io;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * max_fds)] = {};
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t n;
  do n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
  while (n < 0 && errno == EINTR);
  int got[max_fds];
  int ngot = 0;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const std::size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (std::size_t i = 0; i < k; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      if (ngot < max_fds)
        got[ngot++] = fd;
      else
        close(fd);  // more than any message of ours carries
    }
  }
  const bool ok = n == static_cast<ssize_t>(bytes) && (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) == 0 && ngot == nfds;
  for (int i = 0; i < ngot; ++i) {
    if (ok)
      fds[i] = got[i];
    else
      close(got[i]);
  }
  return ok;
}

ncclResult_t listen_and_accept(ncclComm& comm, const sockaddr_un& address, socklen_t length) {
  const int listener = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (listener < 0 || bind(listener, reinterpret_cast<const sockaddr*>(&address), length) != 0 ||
      listen(listener, max_ranks) != 0) {
    warn(&comm, "cannot listen on the bootstrap socket of %s: %s", comm.name.c_str(), std::strerror(errno));
    if (listener >= 0) close(listener);
    return ncclSystemError;
  }
  const auto deadline = clock::now() + connect_deadline;
  ncclResult_t result = ncclSuccess;
  for (int accepted = 1; accepted < comm.nranks && result == ncclSuccess;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now()).count();
    const int sock = left > 0 && wait_readable(listener, static_cast<int>(left))
                         ? accept4(listener, nullptr, nullptr, SOCK_CLOEXEC)
                         : -1;
    hello h;
    if (sock < 0 || !receive_message(sock, &h, sizeof h, nullptr, 0, exchange_timeout_ms)) {
      warn(&comm, "%d of %d ranks connected to the bootstrap of %s before the deadline", accepted, comm.nranks,
           comm.name.c_str());
      if (sock >= 0) close(sock);
      result = ncclSystemError;
    } else if (h.magic != hello_magic || h.nranks != comm.nranks || h.rank <= 0 || h.rank >= comm.nranks ||
               comm.boot.to_rank[h.rank] >= 0) {
      warn(&comm, "a bad bootstrap hello (rank %d of %d)", h.rank, h.nranks);
      close(sock);
      result = ncclInvalidUsage;
    } else {
      comm.boot.to_rank[h.rank] = sock;
      ++accepted;
    }
  }
  close(listener);
  return result;
}

ncclResult_t connect_to_hub(ncclComm& comm, const sockaddr_un& address, socklen_t length) {
  const auto deadline = clock::now() + connect_deadline;
  for (;;) {
    const int sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (sock < 0) break;
    if (connect(sock, reinterpret_cast<const sockaddr*>(&address), length) == 0) {
      const hello h{hello_magic, comm.rank, comm.nranks};
      if (!send_message(sock, &h, sizeof h, nullptr, 0)) {
        close(sock);
        break;
      }
      comm.boot.to_hub = sock;
      return ncclSuccess;
    }
    const int error = errno;
    close(sock);
    if ((error != ECONNREFUSED && error != ENOENT && error != EAGAIN) || clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // rank 0 is not listening yet
  }
  warn(&comm, "cannot connect to the bootstrap of %s: %s", comm.name.c_str(), std::strerror(errno));
  return ncclSystemError;
}

ncclResult_t exchange_failed(const ncclComm& comm, int with) {
  warn(&comm, "the bootstrap exchange with rank %d failed (gone, or silent for %d s)", with,
       exchange_timeout_ms / 1000);
  return ncclSystemError;
}

// A pair of descriptors on its way from one rank to another through the hub.
struct route {
  int from = 0, to = 0;
};

// Keeps a pair that arrived for this rank; false (closing it) when it is not from a peer that had not sent one yet.
bool keep_routed(const ncclComm& comm, const route& header, const int fds[2], int* from_peer) {
  const bool ok = header.to == comm.rank && header.from >= 0 && header.from < comm.nranks && header.from != comm.rank &&
                  from_peer[2 * header.from] < 0;
  if (!ok) {
    warn(&comm, "a bad descriptor message (from %d to %d)", header.from, header.to);
    close(fds[0]);
    close(fds[1]);
    return false;
  }
  from_peer[2 * header.from] = fds[0];
  from_peer[2 * header.from + 1] = fds[1];
  return true;
}

// The hub takes one pair from rank `from`: its own, or one it passes on (its copies closed then).
ncclResult_t relay_one(ncclComm& comm, int from, int* from_peer) {
  route header;
  int fds[2];
  if (!receive_message(comm.boot.to_rank[static_cast<std::size_t>(from)], &header, sizeof header, fds, 2,
                       exchange_timeout_ms))
    return exchange_failed(comm, from);
  if (header.from != from || header.to < 0 || header.to >= comm.nranks || header.to == from) {
    warn(&comm, "a bad descriptor message from rank %d (from %d to %d)", from, header.from, header.to);
    close(fds[0]);
    close(fds[1]);
    return ncclInternalError;
  }
  if (header.to == 0) return keep_routed(comm, header, fds, from_peer) ? ncclSuccess : ncclInternalError;
  const bool sent =
      send_message(comm.boot.to_rank[static_cast<std::size_t>(header.to)], &header, sizeof header, fds, 2);
  close(fds[0]);
  close(fds[1]);
  return sent ? ncclSuccess : exchange_failed(comm, header.to);
}

}  // namespace

ncclResult_t bootstrap_connect(ncclComm& comm) {
  comm.boot.to_rank.assign(static_cast<std::size_t>(comm.nranks), -1);
  if (comm.nranks == 1) return ncclSuccess;
  sockaddr_un address;
  const socklen_t length = socket_address(comm.name, address);
  return comm.rank == 0 ? listen_and_accept(comm, address, length) : connect_to_hub(comm, address, length);
}

ncclResult_t bootstrap_allgather(ncclComm& comm, const void* mine, std::size_t bytes, void* all) {
  auto* out = static_cast<char*>(all);
  const std::size_t n = static_cast<std::size_t>(comm.nranks), me = static_cast<std::size_t>(comm.rank);
  std::memcpy(out + me * bytes, mine, bytes);
  if (comm.rank == 0) {
    for (std::size_t r = 1; r < n; ++r)
      if (!receive_message(comm.boot.to_rank[r], out + r * bytes, bytes, nullptr, 0, exchange_timeout_ms))
        return exchange_failed(comm, static_cast<int>(r));
    for (std::size_t r = 1; r < n; ++r)
      if (!send_message(comm.boot.to_rank[r], out, n * bytes, nullptr, 0))
        return exchange_failed(comm, static_cast<int>(r));
    return ncclSuccess;
  }
  if (!send_message(comm.boot.to_hub, mine, bytes, nullptr, 0) ||
      !receive_message(comm.boot.to_hub, out, n * bytes, nullptr, 0, exchange_timeout_ms))
    return exchange_failed(comm, 0);
  return ncclSuccess;
}

ncclResult_t bootstrap_send_fds(ncclComm& comm, const int* for_peer, int* from_peer) {
  const int n = comm.nranks, me = comm.rank;
  for (int i = 0; i < 2 * n; ++i) from_peer[i] = -1;
  if (me != 0) {
    for (int to = 0; to < n; ++to) {
      const route header{me, to};
      if (to != me && !send_message(comm.boot.to_hub, &header, sizeof header, for_peer + 2 * to, 2))
        return exchange_failed(comm, 0);
    }
    for (int k = 1; k < n; ++k) {
      route header;
      int fds[2];
      if (!receive_message(comm.boot.to_hub, &header, sizeof header, fds, 2, exchange_timeout_ms))
        return exchange_failed(comm, 0);
      if (!keep_routed(comm, header, fds, from_peer)) return ncclInternalError;
    }
    return ncclSuccess;
  }
  for (int to = 1; to < n; ++to) {
    const route header{0, to};
    if (!send_message(comm.boot.to_rank[static_cast<std::size_t>(to)], &header, sizeof header, for_peer + 2 * to, 2))
      return exchange_failed(comm, to);
  }
  for (int from = 1; from < n; ++from)
    for (int k = 1; k < n; ++k) FAKE_NCCL_TRY(relay_one(comm, from, from_peer));
  return ncclSuccess;
}

ncclResult_t bootstrap_barrier(ncclComm& comm) {
  std::vector<char> all(static_cast<std::size_t>(comm.nranks));
  const char mine = 'b';
  return bootstrap_allgather(comm, &mine, 1, all.data());
}

void bootstrap_close(ncclComm& comm) {
  for (int& sock : comm.boot.to_rank)
    if (sock >= 0) close(std::exchange(sock, -1));
  if (comm.boot.to_hub >= 0) close(std::exchange(comm.boot.to_hub, -1));
}

}  // namespace fake_nccl
