// Sets up an io_uring as libuv does and says how it went: "io_uring: ok", or "io_uring: errno N" (cuda-ckpt run
// refuses it with ENOSYS; tests/emu/cli_e2e_test.cpp).
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

int main() {
  unsigned char params[120] = {};  // struct io_uring_params, zeroed: the kernel fills it in
  const long fd = ::syscall(__NR_io_uring_setup, 4, params);
  if (fd < 0) {
    std::printf("io_uring: errno %d\n", errno);
    return 0;
  }
  ::close(static_cast<int>(fd));
  std::printf("io_uring: ok\n");
  return 0;
}
