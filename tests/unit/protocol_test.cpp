// Unit tests of the control channel's transport: runtime dir, sockets, peer checks, framing, fd passing.
#include <catch2/catch.hpp>

#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "skip.hpp"
#include "vmmckpt/protocol/protocol.hpp"

namespace proto = vmmckpt::protocol;

namespace {

int open_fd_count() {
  int n = 0;
  DIR* d = ::opendir("/proc/self/fd");
  REQUIRE(d != nullptr);
  while (dirent* e = ::readdir(d))
    if (e->d_name[0] != '.') ++n;
  ::closedir(d);
  return n;
}

// 250 pipes plus what arrives for them is more than a 1024-fd soft limit leaves room for.
void raise_fd_limit() {
  rlimit rl{};
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &rl) == 0);
  if (rl.rlim_cur < 4096 && rl.rlim_max > rl.rlim_cur) {
    rl.rlim_cur = rl.rlim_max < 4096 ? rl.rlim_max : 4096;
    ::setrlimit(RLIMIT_NOFILE, &rl);
  }
}

bool has_cloexec(int fd) { return (::fcntl(fd, F_GETFD) & FD_CLOEXEC) != 0; }

struct socket_pair {
  int a = -1, b = -1;
  socket_pair() {
    int sv[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
    a = sv[0];
    b = sv[1];
  }
  void close_a() {
    if (a >= 0) ::close(a);
    a = -1;
  }
  ~socket_pair() {
    close_a();
    if (b >= 0) ::close(b);
  }
};

struct pipes {
  std::vector<int> read_ends, write_ends;
  explicit pipes(int n) {
    for (int i = 0; i < n; ++i) {
      int p[2];
      REQUIRE(::pipe2(p, O_CLOEXEC) == 0);
      read_ends.push_back(p[0]);
      write_ends.push_back(p[1]);
    }
  }
  void close_all() {
    for (int f : read_ends) ::close(f);
    for (int f : write_ends) ::close(f);
    read_ends.clear();
    write_ends.clear();
  }
  ~pipes() { close_all(); }
};

std::string pattern(std::size_t n) {
  std::string s(n, '\0');
  for (std::size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 131 + i / 4093) & 0xff);
  return s;
}

void put_u32(unsigned char* out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<unsigned char>(v >> (8 * i));
}

// Sends a hand-made frame (header fields as given) so malformed input can be fed to recv_frame.
void raw_send(int fd, std::uint32_t magic, std::uint32_t version, std::uint32_t length, std::uint32_t fd_count,
              const std::string& body, const std::vector<int>& fds) {
  unsigned char header[proto::frame_header_size];
  put_u32(header, magic);
  put_u32(header + 4, version);
  put_u32(header + 8, length);
  put_u32(header + 12, fd_count);
  put_u32(header + 16, 0);
  iovec v[2] = {{header, sizeof header}, {const_cast<char*>(body.data()), body.size()}};
  alignas(cmsghdr) unsigned char control[CMSG_SPACE(sizeof(int) * 253)];
  msghdr msg{};
  msg.msg_iov = v;
  msg.msg_iovlen = body.empty() ? 1 : 2;
  if (!fds.empty()) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  REQUIRE(::sendmsg(fd, &msg, MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof header + body.size()));
}

// Sends one frame from another thread (a large one does not fit in the socket buffer) and
// receives it here; returns whether both sides succeeded.
bool round_trip(const std::string& payload, const std::vector<int>& fds, std::string& got, std::vector<int>& got_fds) {
  socket_pair sp;
  bool sent = false;
  proto::failure send_error, recv_error;
  std::thread sender([&] { sent = proto::send_frame(sp.a, payload, fds, send_error); });
  bool received = proto::recv_frame(sp.b, got, got_fds, 10000, recv_error);
  sender.join();
  INFO("send: " << send_error.text << " recv: " << recv_error.text);
  return sent && received;
}

// Each received fd must be the same pipe as the one sent: same inode, and bytes written to
// the original's write end come out of it.
void check_same_pipes(const pipes& p, const std::vector<int>& got) {
  REQUIRE(got.size() == p.read_ends.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    struct stat a {
    }, b{};
    REQUIRE(::fstat(got[i], &a) == 0);
    REQUIRE(::fstat(p.read_ends[i], &b) == 0);
    REQUIRE(a.st_ino == b.st_ino);
    REQUIRE(a.st_dev == b.st_dev);
    REQUIRE(has_cloexec(got[i]));
    unsigned char byte = static_cast<unsigned char>(i);
    REQUIRE(::write(p.write_ends[i], &byte, 1) == 1);
    unsigned char back = 0;
    REQUIRE(::read(got[i], &back, 1) == 1);
    REQUIRE(back == byte);
  }
}

void close_all(std::vector<int>& fds) {
  for (int f : fds) ::close(f);
  fds.clear();
}

// A temporary directory standing in for XDG_RUNTIME_DIR; the old value comes back afterwards.
struct temp_runtime {
  std::string root;
  std::optional<std::string> saved;
  temp_runtime() {
    char name[] = "/tmp/vmmckpt-test-XXXXXX";
    REQUIRE(::mkdtemp(name) != nullptr);
    root = name;
    if (const char* old = ::getenv("XDG_RUNTIME_DIR")) saved = old;
    ::setenv("XDG_RUNTIME_DIR", root.c_str(), 1);
  }
  ~temp_runtime() {
    if (saved)
      ::setenv("XDG_RUNTIME_DIR", saved->c_str(), 1);
    else
      ::unsetenv("XDG_RUNTIME_DIR");
    std::error_code ec;
    std::filesystem::remove_all(root, ec);
  }
};

mode_t mode_of(const std::string& path) {
  struct stat st {};
  REQUIRE(::lstat(path.c_str(), &st) == 0);
  return st.st_mode;
}

// A malformed frame carrying one real fd: recv_frame must fail with `expected` in its error and
// leave no descriptor behind.
void check_rejected(std::uint32_t magic, std::uint32_t version, std::uint32_t length, std::uint32_t fd_count,
                    const std::string& body, int fds_to_send, bool close_after, const std::string& expected) {
  const int before = open_fd_count();
  {
    socket_pair sp;
    {
      pipes p(fds_to_send);
      raw_send(sp.a, magic, version, length, fd_count, body, p.read_ends);
    }
    if (close_after) sp.close_a();
    std::string payload;
    proto::failure error;
    std::vector<int> fds;
    REQUIRE_FALSE(proto::recv_frame(sp.b, payload, fds, 2000, error));
    INFO("error: " << error.text);
    REQUIRE(error.text.find(expected) != std::string::npos);
    REQUIRE(fds.empty());
    REQUIRE(payload.empty());
  }
  REQUIRE(open_fd_count() == before);
}

}  // namespace

TEST_CASE("frames round-trip small and large payloads", "[protocol]") {
  for (std::size_t size :
       {std::size_t{0}, std::size_t{1}, std::size_t{100}, std::size_t{8} << 20, std::size_t{proto::max_payload}}) {
    INFO("payload size " << size);
    const std::string payload = pattern(size);
    std::string got = "stale";
    std::vector<int> got_fds;
    REQUIRE(round_trip(payload, {}, got, got_fds));
    REQUIRE(got == payload);
    REQUIRE(got_fds.empty());
  }
}

TEST_CASE("frames carry 0, 1 and 250 descriptors that work on arrival", "[protocol]") {
  raise_fd_limit();
  const int before = open_fd_count();
  for (int n : {0, 1, proto::max_fds_per_message}) {
    for (std::size_t size : {std::size_t{20}, std::size_t{6} << 20}) {
      INFO(n << " fds, payload " << size);
      pipes p(n);
      const std::string payload = pattern(size);
      std::string got;
      std::vector<int> got_fds;
      REQUIRE(round_trip(payload, p.read_ends, got, got_fds));
      REQUIRE(got == payload);
      check_same_pipes(p, got_fds);
      close_all(got_fds);
    }
  }
  REQUIRE(open_fd_count() == before);
}

TEST_CASE("back-to-back frames keep their own descriptors", "[protocol]") {
  socket_pair sp;
  pipes first(2), second(3);
  proto::failure error;
  REQUIRE(proto::send_frame(sp.a, R"({"op":"a"})", first.read_ends, error));
  REQUIRE(proto::send_frame(sp.a, R"({"op":"b"})", {}, error));
  REQUIRE(proto::send_frame(sp.a, R"({"op":"c"})", second.read_ends, error));
  std::string payload;
  std::vector<int> fds;
  REQUIRE(proto::recv_frame(sp.b, payload, fds, 1000, error));
  REQUIRE(payload == R"({"op":"a"})");
  check_same_pipes(first, fds);
  close_all(fds);
  REQUIRE(proto::recv_frame(sp.b, payload, fds, 1000, error));
  REQUIRE(payload == R"({"op":"b"})");
  REQUIRE(fds.empty());
  REQUIRE(proto::recv_frame(sp.b, payload, fds, 1000, error));
  REQUIRE(payload == R"({"op":"c"})");
  check_same_pipes(second, fds);
  close_all(fds);
}

TEST_CASE("send_frame refuses more than 250 descriptors and oversized payloads", "[protocol]") {
  raise_fd_limit();
  socket_pair sp;
  pipes p(proto::max_fds_per_message + 1);
  proto::failure error;
  REQUIRE_FALSE(proto::send_frame(sp.a, "{}", p.read_ends, error));
  REQUIRE(error.text.find("too many descriptors") != std::string::npos);
  REQUIRE_FALSE(proto::send_frame(sp.a, std::string(proto::max_payload + 1, 'x'), {}, error));
  REQUIRE(error.text.find("over the limit") != std::string::npos);
  // Nothing went out: the peer sees no frame.
  std::string payload;
  std::vector<int> fds;
  REQUIRE_FALSE(proto::recv_frame(sp.b, payload, fds, 50, error));
  REQUIRE(error.kind == proto::failure_kind::timed_out);
}

TEST_CASE("malformed frames are refused without leaking descriptors", "[protocol]") {
  const std::string body = "{}";
  SECTION("bad magic") { check_rejected(0x12345678, proto::version, 2, 1, body, 1, false, "magic"); }
  SECTION("another protocol version") {
    check_rejected(
        proto::frame_magic, proto::version + 1, 2, 1, body, 1, false,
        "protocol version " + std::to_string(proto::version + 1) + ", expected " + std::to_string(proto::version));
  }
  SECTION("oversized payload length") {
    check_rejected(proto::frame_magic, proto::version, proto::max_payload + 1, 1, body, 1, false, "over the limit");
  }
  SECTION("more descriptors declared than allowed") {
    check_rejected(proto::frame_magic, proto::version, 2, 251, body, 1, false, "more than 250");
  }
  SECTION("fewer descriptors carried than declared") {
    check_rejected(proto::frame_magic, proto::version, 2, 2, body, 1, false, "declares 2 descriptors but carried 1");
  }
  SECTION("descriptors carried but none declared") {
    check_rejected(proto::frame_magic, proto::version, 2, 0, body, 3, false, "declares 0 descriptors but carried 3");
  }
  SECTION("peer closes mid-payload") {
    check_rejected(proto::frame_magic, proto::version, 100, 1, std::string(10, 'x'), 1, true,
                   "connection closed mid-frame");
  }
  SECTION("peer closes mid-header") {
    const int before = open_fd_count();
    {
      socket_pair sp;
      REQUIRE(::send(sp.a, "VMCK1234", 8, MSG_NOSIGNAL) == 8);
      sp.close_a();
      std::string payload;
      proto::failure error;
      std::vector<int> fds;
      REQUIRE_FALSE(proto::recv_frame(sp.b, payload, fds, 1000, error));
      REQUIRE(error.kind == proto::failure_kind::connection_closed);
    }
    REQUIRE(open_fd_count() == before);
  }
}

TEST_CASE("a closed connection and a silent peer are told apart", "[protocol]") {
  std::string payload;
  proto::failure error;
  std::vector<int> fds;
  {
    socket_pair sp;
    sp.close_a();
    REQUIRE_FALSE(proto::recv_frame(sp.b, payload, fds, 1000, error));
    REQUIRE(error.kind == proto::failure_kind::connection_closed);
  }
  {
    socket_pair sp;
    auto start = std::chrono::steady_clock::now();
    REQUIRE_FALSE(proto::recv_frame(sp.b, payload, fds, 100, error));
    auto elapsed = std::chrono::steady_clock::now() - start;
    REQUIRE(error.kind == proto::failure_kind::timed_out);
    REQUIRE(elapsed >= std::chrono::milliseconds(95));
    REQUIRE(elapsed < std::chrono::seconds(2));
  }
  {
    // The deadline covers the whole frame, not each read: a peer trickling a header still times out.
    socket_pair sp;
    REQUIRE(::send(sp.a, "VMCK", 4, MSG_NOSIGNAL) == 4);
    REQUIRE_FALSE(proto::recv_frame(sp.b, payload, fds, 100, error));
    REQUIRE(error.kind == proto::failure_kind::timed_out);
  }
}

TEST_CASE("send_frame to a gone or stuck peer fails instead of killing or hanging", "[protocol]") {
  proto::failure error;
  {
    socket_pair sp;
    ::close(sp.b);
    sp.b = -1;
    // Without MSG_NOSIGNAL this would raise SIGPIPE and end the test run.
    REQUIRE_FALSE(proto::send_frame(sp.a, "{}", {}, error));
    REQUIRE(error.kind == proto::failure_kind::connection_closed);
  }
  {
    socket_pair sp;  // nobody reads sp.b: 8 MiB cannot fit in the socket buffers
    auto start = std::chrono::steady_clock::now();
    REQUIRE_FALSE(proto::send_frame(sp.a, pattern(8 << 20), {}, 100, error));
    REQUIRE(error.kind == proto::failure_kind::timed_out);
    REQUIRE(std::chrono::steady_clock::now() - start < std::chrono::seconds(2));
  }
}

TEST_CASE("the runtime directory follows XDG_RUNTIME_DIR or falls back to /tmp", "[protocol]") {
  temp_runtime rt;
  REQUIRE(proto::runtime_dir() == rt.root + "/vmmckpt");
  REQUIRE(proto::socket_path(1234) == rt.root + "/vmmckpt/1234.sock");
  ::setenv("XDG_RUNTIME_DIR", "", 1);
  REQUIRE(proto::runtime_dir() == "/tmp/vmmckpt-" + std::to_string(::geteuid()));
  ::unsetenv("XDG_RUNTIME_DIR");
  REQUIRE(proto::runtime_dir() == "/tmp/vmmckpt-" + std::to_string(::geteuid()));
}

TEST_CASE("ensure_runtime_dir creates 0700, tightens our own open dir, refuses the rest", "[protocol]") {
  temp_runtime rt;
  const std::string dir = rt.root + "/vmmckpt";
  proto::failure error;

  SECTION("created 0700 even under a umask that drops our own bits") {
    mode_t old = ::umask(0277);
    bool ok = proto::ensure_runtime_dir(error);
    ::umask(old);
    INFO(error.text);
    REQUIRE(ok);
    REQUIRE(S_ISDIR(mode_of(dir)));
    REQUIRE((mode_of(dir) & 07777) == 0700);
    REQUIRE(proto::ensure_runtime_dir(error));  // and accepted as it is the second time
  }
  SECTION("our own too-open directory is tightened") {
    REQUIRE(::mkdir(dir.c_str(), 0700) == 0);
    REQUIRE(::chmod(dir.c_str(), 0777) == 0);
    REQUIRE(proto::ensure_runtime_dir(error));
    REQUIRE((mode_of(dir) & 07777) == 0700);
  }
  SECTION("a symlink is refused") {
    const std::string target = rt.root + "/elsewhere";
    REQUIRE(::mkdir(target.c_str(), 0700) == 0);
    REQUIRE(::symlink(target.c_str(), dir.c_str()) == 0);
    REQUIRE_FALSE(proto::ensure_runtime_dir(error));
    REQUIRE(error.text.find(dir) != std::string::npos);
    REQUIRE(error.text.find("symlink") != std::string::npos);
  }
  SECTION("a regular file is refused") {
    int f = ::open(dir.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
    REQUIRE(f >= 0);
    ::close(f);
    REQUIRE_FALSE(proto::ensure_runtime_dir(error));
    REQUIRE(error.text.find("not a directory") != std::string::npos);
  }
  SECTION("a missing XDG_RUNTIME_DIR is not created") {
    ::setenv("XDG_RUNTIME_DIR", (rt.root + "/missing").c_str(), 1);
    REQUIRE_FALSE(proto::ensure_runtime_dir(error));
    REQUIRE(error.text.find(rt.root + "/missing/vmmckpt") != std::string::npos);
    REQUIRE(::access((rt.root + "/missing").c_str(), F_OK) != 0);
  }
}

TEST_CASE("ensure_runtime_dir refuses someone else's directory and leaves it alone", "[protocol]") {
  if (::geteuid() != 0) VMMCKPT_SKIP("chowning a directory to another user needs root");
  temp_runtime rt;
  const std::string dir = rt.root + "/vmmckpt";
  proto::failure error;
  REQUIRE(::mkdir(dir.c_str(), 0700) == 0);
  REQUIRE(::chown(dir.c_str(), 65534, 65534) == 0);
  REQUIRE(::chmod(dir.c_str(), 0755) == 0);
  REQUIRE_FALSE(proto::ensure_runtime_dir(error));
  REQUIRE(error.text.find("owned by uid 65534") != std::string::npos);
  REQUIRE((mode_of(dir) & 07777) == 0755);
}

TEST_CASE("listen_at makes a 0600 socket and connect_to names each failure", "[protocol]") {
  temp_runtime rt;
  proto::failure error;
  REQUIRE(proto::ensure_runtime_dir(error));
  const std::string path = proto::socket_path(::getpid());

  int listener = proto::listen_at(path, error);
  INFO(error.text);
  REQUIRE(listener >= 0);
  REQUIRE(has_cloexec(listener));
  REQUIRE(S_ISSOCK(mode_of(path)));
  REQUIRE((mode_of(path) & 07777) == 0600);

  int client = proto::connect_to(path, error);
  REQUIRE(client >= 0);
  REQUIRE(has_cloexec(client));
  int server = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
  REQUIRE(server >= 0);

  uid_t uid = 0;
  pid_t pid = 0;
  REQUIRE(proto::peer_allowed(server, uid, pid));
  REQUIRE(uid == ::geteuid());
  REQUIRE(pid == ::getpid());

  std::string payload;
  std::vector<int> fds;
  REQUIRE(proto::send_frame(client, R"({"op":"hello"})", {}, error));
  REQUIRE(proto::recv_frame(server, payload, fds, 1000, error));
  REQUIRE(payload == R"({"op":"hello"})");
  ::close(client);
  ::close(server);

  // The listener goes away without removing its file: that is what a crashed process leaves.
  ::close(listener);
  REQUIRE(proto::connect_to(path, error) < 0);
  REQUIRE(error.kind == proto::failure_kind::connection_refused);
  REQUIRE(error.text.find("refused") != std::string::npos);
  REQUIRE(error.text.find(path) != std::string::npos);

  // A stale socket file is replaced by the next listener.
  listener = proto::listen_at(path, error);
  REQUIRE(listener >= 0);
  ::close(listener);
  ::unlink(path.c_str());

  REQUIRE(proto::connect_to(path, error) < 0);
  REQUIRE(error.kind == proto::failure_kind::no_socket);
  REQUIRE(error.text.find("no such socket") != std::string::npos);

  // Something that is not a socket is not ours to delete.
  const std::string file = rt.root + "/vmmckpt/file.sock";
  int f = ::open(file.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
  REQUIRE(f >= 0);
  ::close(f);
  REQUIRE(proto::listen_at(file, error) < 0);
  REQUIRE(error.text.find("not a socket") != std::string::npos);
  REQUIRE(S_ISREG(mode_of(file)));

  REQUIRE(proto::listen_at(rt.root + "/" + std::string(120, 'x'), error) < 0);
  REQUIRE(error.text.find("too long") != std::string::npos);
  REQUIRE(proto::connect_to(rt.root + "/" + std::string(120, 'x'), error) < 0);
  REQUIRE(error.text.find("too long") != std::string::npos);
}

TEST_CASE("an abstract address: listened at and connected to like a path, gone with its socket", "[protocol]") {
  // Our own pid's name plus a suffix, so that a test running beside a real shim never takes its name.
  const std::string name = proto::abstract_address(::getpid()) + "-test";
  REQUIRE(proto::is_abstract(name));
  REQUIRE_FALSE(proto::is_abstract("/tmp/x.sock"));
  REQUIRE(proto::printable_address(name) == "@vmmckpt/" + std::to_string(::getpid()) + "-test");
  REQUIRE(proto::printable_address("/tmp/x.sock") == "/tmp/x.sock");
  proto::failure error;
  const int listener = proto::listen_at(name, error);
  INFO(error.text);
  REQUIRE(listener >= 0);
  // The name is taken while its socket lives.
  REQUIRE(proto::listen_at(name, error) < 0);
  REQUIRE(error.text.find("another process holds the name") != std::string::npos);
  const int client = proto::connect_to(name, 2000, error);
  REQUIRE(client >= 0);
  uid_t uid = 0;
  pid_t pid = 0;
  REQUIRE(proto::peer_credentials(client, uid, pid));
  REQUIRE(uid == ::geteuid());
  REQUIRE(pid == ::getpid());
  ::close(client);
  ::close(listener);
  // Nothing is left behind: nobody listens under the name any more.
  REQUIRE(proto::connect_to(name, 2000, error) < 0);
  REQUIRE(error.kind == proto::failure_kind::no_socket);
  REQUIRE(error.text == "nobody listens at @vmmckpt/" + std::to_string(::getpid()) + "-test");
}

TEST_CASE("peer_allowed on a socketpair reports our own uid and pid", "[protocol]") {
  socket_pair sp;
  uid_t uid = 12345;
  pid_t pid = 0;
  REQUIRE(proto::peer_allowed(sp.b, uid, pid));
  REQUIRE(uid == ::geteuid());
  REQUIRE(pid == ::getpid());
  REQUIRE_FALSE(proto::peer_allowed(-1, uid, pid));
}

TEST_CASE("a client of another uid is refused by peer_allowed and by the socket's mode", "[protocol]") {
  if (::geteuid() != 0) VMMCKPT_SKIP("connecting as another user needs root to setuid");
  char name[] = "/tmp/vmmckpt-test-XXXXXX";
  REQUIRE(::mkdtemp(name) != nullptr);
  const std::string root = name;
  REQUIRE(::chmod(root.c_str(), 0711) == 0);  // searchable, so only the socket's own mode decides
  proto::failure error;
  const std::string closed_path = root + "/closed.sock", open_path = root + "/open.sock";
  int closed_listener = proto::listen_at(closed_path, error);
  int open_listener = proto::listen_at(open_path, error);
  REQUIRE(closed_listener >= 0);
  REQUIRE(open_listener >= 0);
  REQUIRE(::chmod(open_path.c_str(), 0666) == 0);

  pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    if (::setgroups(0, nullptr) != 0 || ::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(10);
    proto::failure e;
    if (proto::connect_to(closed_path, e) >= 0) ::_exit(11);
    if (e.kind != proto::failure_kind::permission_denied || e.text.find("permission denied") == std::string::npos)
      ::_exit(12);
    int c = proto::connect_to(open_path, e);
    if (c < 0) ::_exit(13);
    char byte;
    while (::read(c, &byte, 1) > 0) {
    }
    ::_exit(0);
  }
  pollfd p{open_listener, POLLIN, 0};
  REQUIRE(::poll(&p, 1, 5000) == 1);
  int server = ::accept4(open_listener, nullptr, nullptr, SOCK_CLOEXEC);
  REQUIRE(server >= 0);
  uid_t uid = 0;
  pid_t pid = 0;
  REQUIRE_FALSE(proto::peer_allowed(server, uid, pid));
  REQUIRE(uid == 65534);
  REQUIRE(pid == child);
  ::close(server);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  ::close(open_listener);
  ::close(closed_listener);
  std::error_code ec;
  std::filesystem::remove_all(root, ec);
}

TEST_CASE("a taken abstract name gives way to a random one, which abstract_addresses finds", "[protocol]") {
  proto::failure error;
  const pid_t me = ::getpid();
  // Someone holds our name first (here: ourselves, through another socket).
  const int taken = proto::listen_at(proto::abstract_address(me), error);
  REQUIRE(taken >= 0);
  std::string name;
  const int fd = proto::listen_abstract_for(me, name, error);
  INFO(error.text);
  REQUIRE(fd >= 0);
  const std::string exact = proto::abstract_address(me);
  REQUIRE(name.size() == exact.size() + 17);
  REQUIRE(name.compare(0, exact.size() + 1, exact + ".") == 0);
  std::string other;
  const int again = proto::listen_abstract_for(me, other, error);
  REQUIRE(again >= 0);
  CHECK(other != name);  // random: a fresh one each time
  // Something under our prefix that is not an alternate (no 16 hex digits) is never offered.
  const int junk = proto::listen_at(exact + ".zz", error);
  REQUIRE(junk >= 0);
  const auto found = proto::abstract_addresses(me);
  REQUIRE(!found.empty());
  CHECK(found.front() == exact);
  CHECK(std::find(found.begin(), found.end(), name) != found.end());
  CHECK(std::find(found.begin(), found.end(), other) != found.end());
  CHECK(std::find(found.begin(), found.end(), exact + ".zz") == found.end());
  for (int f : {taken, fd, again, junk}) ::close(f);
}

TEST_CASE("abstract_addresses leaves out names another process holds, where it can see the sockets", "[protocol]") {
  const pid_t me = ::getpid();
  const std::string planted = proto::abstract_alternate(me, 0x0123456789abcdefULL);
  int ready[2];
  REQUIRE(::pipe(ready) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    proto::failure error;
    const int a = proto::listen_at(proto::abstract_address(me), error);
    const int b = proto::listen_at(planted, error);
    char c = a >= 0 && b >= 0 ? 'r' : 'f';
    (void)::write(ready[1], &c, 1);
    ::pause();
    _exit(0);
  }
  char c = 0;
  REQUIRE(::read(ready[0], &c, 1) == 1);
  REQUIRE(c == 'r');
  // Our own socket under an alternate: the only name of ours that is ours.
  proto::failure error;
  std::string name;
  const int fd = proto::listen_abstract_for(me, name, error);
  REQUIRE(fd >= 0);
  const auto found = proto::abstract_addresses(me);
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  ::close(fd);
  ::close(ready[0]);
  ::close(ready[1]);
  REQUIRE(found == std::vector<std::string>{name});
}
