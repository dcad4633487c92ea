#include "operations/sealed_memfd.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>

namespace vmmckpt::detail {

int sealed_memfd(const char* name, std::size_t bytes, const std::function<bool(unsigned char*)>& fill) {
  const int fd = ::memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return -1;
  auto fail = [fd](int err) {
    ::close(fd);
    errno = err;
    return -1;
  };
  if (bytes > 0) {
    if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) return fail(errno);
    void* at = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (at == MAP_FAILED) return fail(errno);
    const bool filled = fill(static_cast<unsigned char*>(at));
    ::munmap(at, bytes);  // before sealing: a writable mapping would refuse F_SEAL_WRITE
    if (!filled) return fail(EIO);
  }
  if (::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) != 0) return fail(errno);
  return fd;
}

}  // namespace vmmckpt::detail
