// Transport of the control channel: the runtime directory, Unix sockets, peer checks, framing and fd passing.
#include "vmmckpt/protocol/protocol.hpp"

#include "vmmckpt/support/little_endian.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <string_view>

namespace vmmckpt::protocol {
namespace {

// The kernel's SCM_MAX_FD: the most descriptors one message can carry. recv sizes its
// ancillary buffer for that many (plus credentials, should the socket have SO_PASSCRED)
// so a peer sending more than we accept is seen and its fds closed, not silently truncated.
constexpr int kernel_max_fds = 253;
constexpr std::size_t recv_control_size = CMSG_SPACE(sizeof(int) * kernel_max_fds) + CMSG_SPACE(sizeof(struct ucred));
constexpr std::size_t send_control_size = CMSG_SPACE(sizeof(int) * max_fds_per_message);

// Every error string is built here: an allocation failure must not escape (the shim runs
// this inside other people's processes), and the false return already says what matters.
void set_error(failure& error, failure_kind kind, std::initializer_list<std::string_view> parts) noexcept {
  error.kind = kind;
  try {
    error.text.clear();
    for (std::string_view part : parts) error.text.append(part);
  } catch (...) {
  }
}

// Decimal text without allocating, for error messages.
struct number {
  char text[24];
  std::size_t length = 0;
  explicit number(long long value) noexcept {
    length = static_cast<std::size_t>(std::to_chars(text, text + sizeof text, value).ptr - text);
  }
  operator std::string_view() const noexcept { return {text, length}; }
};

struct hex_number {
  char text[24] = {'0', 'x'};
  std::size_t length = 0;
  explicit hex_number(unsigned long long value) noexcept {
    length = static_cast<std::size_t>(std::to_chars(text + 2, text + sizeof text, value, 16).ptr - text);
  }
  operator std::string_view() const noexcept { return {text, length}; }
};

// strerror() is not thread-safe; glibc's strerror_r returns the text (possibly not in buf).
struct errno_text {
  char buffer[128];
  const char* text;
  explicit errno_text(int err) noexcept : text(::strerror_r(err, buffer, sizeof buffer)) {}
  operator std::string_view() const noexcept { return text; }
};

class deadline {
 public:
  explicit deadline(int timeout_ms) noexcept
      : forever_(timeout_ms < 0), end_(clock::now() + std::chrono::milliseconds(timeout_ms < 0 ? 0 : timeout_ms)) {}
  bool forever() const noexcept { return forever_; }
  // Milliseconds left for poll(): -1 forever, 0 when passed, else rounded up so poll
  // never returns just before the deadline and makes us spin.
  int poll_ms() const noexcept {
    if (forever_) return -1;
    auto left = end_ - clock::now();
    if (left <= clock::duration::zero()) return 0;
    auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
    return ms > INT_MAX ? INT_MAX : static_cast<int>(ms);
  }
  bool passed() const noexcept { return !forever_ && clock::now() >= end_; }

 private:
  using clock = std::chrono::steady_clock;
  bool forever_;
  clock::time_point end_;
};

// Waits until fd is ready for `events` or the deadline passes; false, with `error` set (timed out, or poll
// failed), when it is not ready. The socket calls themselves use MSG_DONTWAIT, so a spurious wake-up only costs
// another turn of the caller's loop.
bool wait_for(int fd, short events, const deadline& until, failure& error) noexcept {
  for (;;) {
    pollfd p{fd, events, 0};
    int r = ::poll(&p, 1, until.poll_ms());
    if (r < 0 && errno == EINTR) continue;
    const int err = r < 0 ? errno : (p.revents & POLLNVAL) != 0 ? EBADF : 0;
    if (err != 0) {
      set_error(error, failure_kind::system, {"poll failed: ", errno_text(err)});
      return false;
    }
    if (r > 0) return true;  // POLLERR / POLLHUP: the send or recv that follows reports what happened
    if (until.passed()) {
      set_error(error, failure_kind::timed_out, {"timed out"});
      return false;
    }
  }
}

void put_u32(unsigned char* out, std::uint32_t v) noexcept { put_le(out, v, 4); }
std::uint32_t get_u32(const unsigned char* in) noexcept { return static_cast<std::uint32_t>(get_le(in, 4)); }

bool make_address(const std::string& path, sockaddr_un& addr, socklen_t& length, failure& error) noexcept {
  addr = {};
  addr.sun_family = AF_UNIX;
  if (path.empty()) {
    set_error(error, failure_kind::system, {"empty socket path"});
    return false;
  }
  if (path.size() >= sizeof addr.sun_path) {
    set_error(error, failure_kind::system,
              {"socket path too long (", number(static_cast<long long>(path.size())), " bytes, at most ",
               number(static_cast<long long>(sizeof addr.sun_path - 1)), "): ", path});
    return false;
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  // An abstract name is exactly its bytes (a trailing NUL would be part of it); a path ends with one.
  const bool abstract = path[0] == '\0';
  length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path.size() + (abstract ? 0 : 1));
  return true;
}

void close_fd(int fd) noexcept {
  // Linux releases the descriptor even when close() reports EINTR: never retry.
  if (fd >= 0) ::close(fd);
}

// Descriptors received while reading one frame. Fixed storage: collecting them must not
// allocate, or a failed allocation would leave some of them open.
struct received_fds {
  int fd[max_fds_per_message];
  int count = 0;
  int extra = 0;  // received beyond max_fds_per_message, already closed

  void take(int f) noexcept {
    if (count < max_fds_per_message) {
      fd[count++] = f;
    } else {
      close_fd(f);
      ++extra;
    }
  }
  void close_all() noexcept {
    for (int i = 0; i < count; ++i) close_fd(fd[i]);
    count = 0;
  }
};

void collect_fds(msghdr& msg, received_fds& rx) noexcept {
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    std::size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    const unsigned char* data = CMSG_DATA(c);
    for (std::size_t i = 0; i < n; ++i) {
      int f;
      std::memcpy(&f, data + i * sizeof(int), sizeof(int));  // CMSG_DATA need not be int-aligned
      rx.take(f);
    }
  }
}

// Reads exactly `length` bytes of the frame into buf, collecting descriptors from every
// recvmsg on the way. `frame_done`/`frame_total` only shape the "connection closed" text.
bool read_exact(int fd, unsigned char* buf, std::size_t length, received_fds& rx, const deadline& until,
                std::size_t frame_done, std::size_t frame_total, failure& error) noexcept {
  std::size_t done = 0;
  while (done < length) {
    if (!wait_for(fd, POLLIN, until, error)) return false;
    alignas(cmsghdr) unsigned char control[recv_control_size];
    iovec v{buf + done, length - done};
    msghdr msg{};
    msg.msg_iov = &v;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    ssize_t r = ::recvmsg(fd, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    if (r < 0) {
      const int err = errno;
      if (err == EINTR || err == EAGAIN || err == EWOULDBLOCK) continue;
      if (err == ECONNRESET || err == EPIPE) {
        set_error(error, failure_kind::connection_closed, {"connection closed"});
      } else {
        set_error(error, failure_kind::system, {"receive failed: ", errno_text(err)});
      }
      return false;
    }
    collect_fds(msg, rx);
    if (msg.msg_flags & MSG_CTRUNC) {
      set_error(error, failure_kind::bad_frame,
                {"descriptors truncated in transit (ancillary data did not fit or the fd limit was reached)"});
      return false;
    }
    if (r == 0) {
      std::size_t got = frame_done + done;
      if (got == 0) {
        set_error(error, failure_kind::connection_closed, {"connection closed"});
      } else {
        set_error(error, failure_kind::connection_closed,
                  {"connection closed mid-frame (", number(static_cast<long long>(got)), " of ",
                   number(static_cast<long long>(frame_total)), " bytes)"});
      }
      return false;
    }
    done += static_cast<std::size_t>(r);
  }
  return true;
}

}  // namespace

std::string runtime_dir() noexcept {
  try {
    const char* xdg = ::getenv("XDG_RUNTIME_DIR");
    if (xdg != nullptr && *xdg != '\0') {
      std::string dir(xdg);
      while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
      if (dir != "/") dir += '/';
      return dir + "vmmckpt";
    }
    return "/tmp/vmmckpt-" + std::to_string(::geteuid());
  } catch (...) {
    return {};
  }
}

std::string socket_path(pid_t pid) noexcept {
  try {
    std::string dir = runtime_dir();
    if (dir.empty()) return {};
    return dir + "/" + std::to_string(pid) + ".sock";
  } catch (...) {
    return {};
  }
}

std::string abstract_address(pid_t pid) noexcept {
  try {
    return std::string(1, '\0') + "vmmckpt/" + std::to_string(pid);
  } catch (...) {
    return {};
  }
}

std::string abstract_alternate(pid_t pid, std::uint64_t random) noexcept {
  try {
    char digits[17];
    std::snprintf(digits, sizeof digits, "%016llx", static_cast<unsigned long long>(random));
    return abstract_address(pid) + "." + digits;
  } catch (...) {
    return {};
  }
}

namespace {

constexpr std::size_t alternate_digits = 16;

// The inodes of the sockets pid holds (its /proc/PID/fd links "socket:[N]"); empty when they cannot be read
// (another user's process, or one made non-dumpable).
std::vector<unsigned long> socket_inodes_of(pid_t pid) {
  std::vector<unsigned long> out;
  const std::string dir = "/proc/" + std::to_string(pid) + "/fd";
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return out;
  while (const dirent* e = ::readdir(d)) {
    char link[64];
    const ssize_t n = ::readlinkat(::dirfd(d), e->d_name, link, sizeof link - 1);
    if (n <= 0) continue;
    link[n] = '\0';
    unsigned long inode = 0;
    if (std::sscanf(link, "socket:[%lu]", &inode) == 1) out.push_back(inode);
  }
  ::closedir(d);
  return out;
}

// Whether `shown` (a name as /proc/net/unix shows it) is pid's exact name or one of its alternates.
bool names_pid(const std::string& shown, const std::string& exact) {
  if (shown == exact) return true;
  if (shown.size() != exact.size() + 1 + alternate_digits || shown.compare(0, exact.size(), exact) != 0 ||
      shown[exact.size()] != '.')
    return false;
  return std::all_of(shown.begin() + static_cast<long>(exact.size()) + 1, shown.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

}  // namespace

std::vector<std::string> abstract_addresses(pid_t pid) noexcept {
  try {
    const std::string exact = printable_address(abstract_address(pid));
    // (name as shown, inode) of every socket bound under one of pid's names in its network namespace.
    std::vector<std::pair<std::string, unsigned long>> bound;
    if (std::FILE* in = std::fopen(("/proc/" + std::to_string(pid) + "/net/unix").c_str(), "re")) {
      char line[512];
      while (std::fgets(line, sizeof line, in) != nullptr) {
        // "Num: RefCount Protocol Flags Type St Inode Path": the path follows the seventh field.
        unsigned long inode = 0;
        int path_at = 0;
        if (std::sscanf(line, "%*s %*s %*s %*s %*s %*s %lu %n", &inode, &path_at) < 1 || path_at == 0) continue;
        std::string shown(line + path_at);
        while (!shown.empty() && (shown.back() == '\n' || shown.back() == ' ')) shown.pop_back();
        if (names_pid(shown, exact)) bound.emplace_back(std::move(shown), inode);
      }
      std::fclose(in);
    }
    // Where pid's own sockets can be seen, only the names it holds are worth a connection: anyone else's
    // would be refused by the peer check, and one that takes no connection would use up the caller's time.
    const std::vector<unsigned long> held = socket_inodes_of(pid);
    std::vector<std::string> out{abstract_address(pid)};
    if (!held.empty() && !bound.empty() && std::none_of(bound.begin(), bound.end(), [&](const auto& b) {
          return b.first == exact && std::find(held.begin(), held.end(), b.second) != held.end();
        }))
      out.clear();
    for (const auto& [shown, inode] : bound) {
      if (shown == exact) continue;
      if (!held.empty() && std::find(held.begin(), held.end(), inode) == held.end()) continue;
      std::string name = std::string(1, '\0') + shown.substr(1);
      if (std::find(out.begin(), out.end(), name) == out.end()) out.push_back(std::move(name));
    }
    return out;
  } catch (...) {
    return {};
  }
}

bool is_abstract(const std::string& address) noexcept { return !address.empty() && address[0] == '\0'; }

std::string printable_address(const std::string& address) noexcept {
  try {
    return is_abstract(address) ? "@" + address.substr(1) : address;
  } catch (...) {
    return {};
  }
}

bool ensure_runtime_dir(failure& error) noexcept {
  const std::string dir = runtime_dir();
  if (dir.empty()) {
    set_error(error, failure_kind::out_of_memory, {"out of memory"});
    return false;
  }
  // Only the leaf is created: XDG_RUNTIME_DIR belongs to the session manager, and /tmp exists.
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    int err = errno;
    set_error(
        error, failure_kind::system,
        {"cannot create ", dir, ": ", errno_text(err), err == ENOENT ? " (its parent directory does not exist)" : ""});
    return false;
  }
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) {
    int err = errno;
    set_error(error, failure_kind::system, {"cannot inspect ", dir, ": ", errno_text(err)});
    return false;
  }
  if (S_ISLNK(st.st_mode)) {
    set_error(error, failure_kind::system, {"refusing ", dir, ": it is a symlink, not a directory"});
    return false;
  }
  if (!S_ISDIR(st.st_mode)) {
    set_error(error, failure_kind::system, {"refusing ", dir, ": it is not a directory"});
    return false;
  }
  const uid_t me = ::geteuid();
  if (st.st_uid != me) {
    set_error(error, failure_kind::system,
              {"refusing ", dir, ": it is owned by uid ", number(st.st_uid), ", not by us (uid ", number(me),
               "); someone else could plant sockets in it"});
    return false;
  }
  // From here on act through a descriptor opened without following links, so the directory
  // changed is the one just checked even if the name were swapped in between.
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (dfd < 0) {
    int err = errno;
    set_error(error, failure_kind::system, {"cannot open ", dir, ": ", errno_text(err)});
    return false;
  }
  struct stat now {};
  if (::fstat(dfd, &now) != 0 || now.st_dev != st.st_dev || now.st_ino != st.st_ino || now.st_uid != me) {
    close_fd(dfd);
    set_error(error, failure_kind::system, {"refusing ", dir, ": it changed while being checked"});
    return false;
  }
  // Ours but open to others (or missing our own bits): tightening is safe because it is ours,
  // and more useful than refusing a directory the user can fix with the same chmod.
  if ((now.st_mode & 07777) != 0700 && ::fchmod(dfd, 0700) != 0) {
    int err = errno;
    close_fd(dfd);
    set_error(error, failure_kind::system,
              {"refusing ", dir, ": its mode allows access by others and chmod 0700 failed: ", errno_text(err)});
    return false;
  }
  close_fd(dfd);
  return true;
}

std::string private_dir_prefix(uid_t uid) noexcept {
  try {
    return "/tmp/vmmckpt-" + std::to_string(uid) + ".";
  } catch (...) {
    return {};
  }
}

std::string make_private_dir(failure& error) noexcept {
  try {
    std::string dir = private_dir_prefix(::geteuid()) + "XXXXXX";
    if (::mkdtemp(dir.data()) == nullptr) {
      int err = errno;
      set_error(error, failure_kind::system, {"cannot create a private directory in /tmp: ", errno_text(err)});
      return {};
    }
    return dir;
  } catch (...) {
    set_error(error, failure_kind::out_of_memory, {"out of memory"});
    return {};
  }
}

namespace {

// An abstract name has no file: no mode to set, nothing to replace, and it goes with its socket.
// `bind_errno` is set to bind's errno when binding failed (EADDRINUSE: someone holds the name).
int listen_abstract(const sockaddr_un& addr, socklen_t addr_length, const std::string& name, failure& error,
                    int& bind_errno) noexcept {
  const std::string shown = printable_address(name);
  bind_errno = 0;
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    int err = errno;
    set_error(error, failure_kind::system, {"cannot create a socket: ", errno_text(err)});
    return -1;
  }
  const bool bound = ::bind(fd, reinterpret_cast<const sockaddr*>(&addr), addr_length) == 0;
  if (!bound || ::listen(fd, 8) != 0) {
    int err = errno;
    if (!bound) bind_errno = err;
    close_fd(fd);
    set_error(error, failure_kind::system,
              {"cannot listen at ", shown, ": ", errno_text(err),
               err == EADDRINUSE ? " (another process holds the name)" : ""});
    return -1;
  }
  return fd;
}

int listen_abstract_name(const std::string& name, failure& error, int& bind_errno) noexcept {
  sockaddr_un addr;
  socklen_t addr_length = 0;
  bind_errno = 0;
  if (!make_address(name, addr, addr_length, error)) return -1;
  return listen_abstract(addr, addr_length, name, error, bind_errno);
}

}  // namespace

int listen_abstract_for(pid_t pid, std::string& name, failure& error) noexcept {
  try {
    name = abstract_address(pid);
    int bind_errno = 0;
    int fd = listen_abstract_name(name, error, bind_errno);
    // Someone else took the name first (it is guessable: the pid): a random one nobody can have taken ahead.
    for (int attempt = 0; fd < 0 && bind_errno == EADDRINUSE && attempt < 8; ++attempt) {
      std::uint64_t random = 0;
      if (::getrandom(&random, sizeof random, 0) != static_cast<ssize_t>(sizeof random)) {
        int err = errno;
        set_error(error, failure_kind::system,
                  {"cannot listen at ", printable_address(abstract_address(pid)),
                   " (another process holds the name), and getrandom failed: ", errno_text(err)});
        return -1;
      }
      name = abstract_alternate(pid, random);
      fd = listen_abstract_name(name, error, bind_errno);
    }
    return fd;
  } catch (...) {
    set_error(error, failure_kind::out_of_memory, {"out of memory"});
    return -1;
  }
}

int listen_at(const std::string& path, failure& error) noexcept {
  sockaddr_un addr;
  socklen_t addr_length = 0;
  if (!make_address(path, addr, addr_length, error)) return -1;
  if (is_abstract(path)) {
    int bind_errno = 0;
    return listen_abstract(addr, addr_length, path, error, bind_errno);
  }

  // A socket left by an earlier process with our pid is replaced; anything else at the path
  // is not ours to delete.
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      set_error(error, failure_kind::system, {"refusing to replace ", path, ": it exists and is not a socket"});
      return -1;
    }
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
      int err = errno;
      set_error(error, failure_kind::system, {"cannot remove the old socket ", path, ": ", errno_text(err)});
      return -1;
    }
  } else if (errno != ENOENT) {
    int err = errno;
    set_error(error, failure_kind::system, {"cannot inspect ", path, ": ", errno_text(err)});
    return -1;
  }

  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    int err = errno;
    set_error(error, failure_kind::system, {"cannot create a socket: ", errno_text(err)});
    return -1;
  }
  // Linux gives the socket file the mode of the socket's own inode (less the umask), so
  // narrowing it first means the file never exists wider than 0600. Best effort: the chmod
  // below is the guarantee that does not depend on it.
  (void)::fchmod(fd, 0600);
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&addr), addr_length) != 0) {
    int err = errno;
    close_fd(fd);
    set_error(error, failure_kind::system, {"cannot bind ", path, ": ", errno_text(err)});
    return -1;
  }
  // chmod by path right after bind rather than binding under a restrictive umask: umask is
  // process-wide, and changing it would race other threads of the host program creating
  // files. The moment between bind and chmod exposes nothing because the socket lives in the
  // runtime directory, which ensure_runtime_dir keeps at 0700: no one else can reach it.
  if (::chmod(path.c_str(), 0600) != 0) {
    int err = errno;
    close_fd(fd);
    ::unlink(path.c_str());
    set_error(error, failure_kind::system, {"cannot chmod 0600 ", path, ": ", errno_text(err)});
    return -1;
  }
  if (::listen(fd, 8) != 0) {
    int err = errno;
    close_fd(fd);
    ::unlink(path.c_str());
    set_error(error, failure_kind::system, {"cannot listen on ", path, ": ", errno_text(err)});
    return -1;
  }
  return fd;
}

int connect_to(const std::string& path, failure& error) noexcept { return connect_to(path, -1, error); }

int connect_to(const std::string& path, int timeout_ms, failure& error) noexcept {
  sockaddr_un addr;
  socklen_t addr_length = 0;
  if (!make_address(path, addr, addr_length, error)) return -1;
  // Non-blocking: a process whose listen backlog is full (it is stopped, or swamped) answers EAGAIN
  // at once instead of holding connect() until it accepts, so the deadline holds here too.
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    int err = errno;
    set_error(error, failure_kind::system, {"cannot create a socket: ", errno_text(err)});
    return -1;
  }
  const deadline until(timeout_ms);
  for (;;) {
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), addr_length) == 0) return fd;
    int err = errno;
    // An interrupted Unix-socket connect leaves the socket unconnected: try again.
    if (err == EINTR) continue;
    if (err == EISCONN) return fd;
    if (err == EAGAIN) {
      if (until.passed()) {
        close_fd(fd);
        set_error(error, failure_kind::timed_out,
                  {"timed out: ", printable_address(path),
                   " takes no connection (its process is not accepting: stopped or busy)"});
        return -1;
      }
      const int wait_ms = until.forever() ? 10 : std::min(10, until.poll_ms());
      ::poll(nullptr, 0, wait_ms);
      continue;
    }
    close_fd(fd);
    if (is_abstract(path) && err == ECONNREFUSED) {
      // An abstract name nobody listens under: like a path with nothing there.
      set_error(error, failure_kind::no_socket, {"nobody listens at ", printable_address(path)});
      return -1;
    }
    switch (err) {
      case ENOENT: set_error(error, failure_kind::no_socket, {"no such socket: ", path}); break;
      case ECONNREFUSED:
        set_error(error, failure_kind::connection_refused,
                  {"connection refused: ", path, " (a stale socket: its process is gone)"});
        break;
      case EACCES:
      case EPERM:
        set_error(error, failure_kind::permission_denied,
                  {"permission denied: ", path, " (it belongs to another user)"});
        break;
      default:
        set_error(error, failure_kind::system, {"cannot connect to ", printable_address(path), ": ", errno_text(err)});
        break;
    }
    return -1;
  }
}

bool peer_credentials(int fd, uid_t& peer_uid, pid_t& peer_pid) noexcept {
  struct ucred cred {};
  socklen_t length = sizeof cred;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &length) != 0 || length != sizeof cred) {
    peer_uid = static_cast<uid_t>(-1);
    peer_pid = -1;
    return false;
  }
  peer_uid = cred.uid;
  peer_pid = cred.pid;
  return true;
}

bool peer_allowed(int fd, uid_t& peer_uid, pid_t& peer_pid) noexcept {
  if (!peer_credentials(fd, peer_uid, peer_pid)) return false;
  return peer_uid == ::geteuid() || peer_uid == 0;
}

bool send_frame(int fd, const std::string& payload, const std::vector<int>& fds, failure& error) noexcept {
  return send_frame(fd, payload, fds, -1, error);
}

bool send_frame(int fd, const std::string& payload, const std::vector<int>& fds, int timeout_ms,
                failure& error) noexcept {
  if (fds.size() > static_cast<std::size_t>(max_fds_per_message)) {
    set_error(error, failure_kind::too_large,
              {"too many descriptors for one frame: ", number(static_cast<long long>(fds.size())), " (at most ",
               number(max_fds_per_message), ")"});
    return false;
  }
  if (payload.size() > max_payload) {
    set_error(error, failure_kind::too_large,
              {"payload of ", number(static_cast<long long>(payload.size())), " bytes is over the limit of ",
               number(max_payload)});
    return false;
  }
  unsigned char header[frame_header_size];
  put_u32(header + 0, frame_magic);
  put_u32(header + 4, version);
  put_u32(header + 8, static_cast<std::uint32_t>(payload.size()));
  put_u32(header + 12, static_cast<std::uint32_t>(fds.size()));
  put_u32(header + 16, 0);

  alignas(cmsghdr) unsigned char control[send_control_size];
  const std::size_t total = frame_header_size + payload.size();
  std::size_t sent = 0;
  const deadline until(timeout_ms);
  while (sent < total) {
    iovec v[2];
    int count = 0;
    if (sent < frame_header_size) {
      v[count++] = {header + sent, frame_header_size - sent};
      if (!payload.empty()) v[count++] = {const_cast<char*>(payload.data()), payload.size()};
    } else {
      v[count++] = {const_cast<char*>(payload.data()) + (sent - frame_header_size), total - sent};
    }
    msghdr msg{};
    msg.msg_iov = v;
    msg.msg_iovlen = static_cast<std::size_t>(count);
    // The descriptors ride with the frame's first byte: the kernel attaches them to the
    // first chunk of a partial send, so they go only until something has been sent.
    if (sent == 0 && !fds.empty()) {
      msg.msg_control = control;
      msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
      std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
    }
    // MSG_DONTWAIT with poll below keeps the deadline honest on a blocking socket too;
    // MSG_NOSIGNAL because SIGPIPE would kill a host program that does not expect it.
    ssize_t r = ::sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (r > 0) {
      sent += static_cast<std::size_t>(r);
      continue;
    }
    int err = r == 0 ? EPIPE : errno;
    if (err == EINTR) continue;
    if (err == EAGAIN || err == EWOULDBLOCK) {
      if (!wait_for(fd, POLLOUT, until, error)) return false;
      continue;
    }
    if (err == EPIPE || err == ECONNRESET) {
      set_error(error, failure_kind::connection_closed, {"connection closed"});
    } else {
      set_error(error, failure_kind::system, {"send failed: ", errno_text(err)});
    }
    return false;
  }
  return true;
}

void close_all(std::vector<int>& fds) noexcept {
  for (int f : fds) ::close(f);
  fds.clear();
}

bool recv_frame(int fd, std::string& payload, std::vector<int>& fds, int timeout_ms, failure& error) noexcept {
  received_fds rx;
  payload.clear();
  fds.clear();
  const deadline until(timeout_ms);
  // Whatever arrived is closed on every way out but success.
  auto fail = [&rx]() noexcept {
    rx.close_all();
    return false;
  };

  unsigned char header[frame_header_size];
  if (!read_exact(fd, header, frame_header_size, rx, until, 0, frame_header_size, error)) return fail();
  const std::uint32_t magic = get_u32(header + 0);
  const std::uint32_t frame_version = get_u32(header + 4);
  const std::uint32_t length = get_u32(header + 8);
  const std::uint32_t fd_count = get_u32(header + 12);
  if (magic != frame_magic) {
    set_error(error, failure_kind::bad_frame,
              {"bad frame magic ", hex_number(magic), " (expected ", hex_number(frame_magic),
               "): not a vmmckpt control frame"});
    return fail();
  }
  if (frame_version != version) {
    set_error(error, failure_kind::bad_frame,
              {"protocol version ", number(frame_version), ", expected ", number(version)});
    return fail();
  }
  if (length > max_payload) {
    set_error(error, failure_kind::bad_frame,
              {"payload of ", number(length), " bytes is over the limit of ", number(max_payload)});
    return fail();
  }
  if (fd_count > static_cast<std::uint32_t>(max_fds_per_message)) {
    set_error(error, failure_kind::bad_frame,
              {"frame declares ", number(fd_count), " descriptors, more than ", number(max_fds_per_message)});
    return fail();
  }

  std::string body;
  try {
    body.resize(length);
  } catch (...) {
    set_error(error, failure_kind::out_of_memory, {"out of memory for a payload of ", number(length), " bytes"});
    return fail();
  }
  if (length > 0 && !read_exact(fd, reinterpret_cast<unsigned char*>(body.data()), length, rx, until, frame_header_size,
                                frame_header_size + length, error)) {
    return fail();
  }
  const long long received = static_cast<long long>(rx.count) + rx.extra;
  if (received != static_cast<long long>(fd_count)) {
    set_error(error, failure_kind::bad_frame,
              {"frame declares ", number(fd_count), " descriptors but carried ", number(received)});
    return fail();
  }
  try {
    fds.assign(rx.fd, rx.fd + rx.count);
  } catch (...) {
    fds.clear();
    set_error(error, failure_kind::out_of_memory, {"out of memory"});
    return fail();
  }
  payload.swap(body);
  return true;
}

}  // namespace vmmckpt::protocol
