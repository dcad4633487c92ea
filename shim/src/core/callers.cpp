// Who called an entry point.
#include "core/callers.hpp"

#include <dlfcn.h>

#include <cstring>

namespace vmmckpt::detail {

bool called_from_nccl(const void* return_address) noexcept {
  Dl_info info{};
  if (return_address == nullptr || ::dladdr(return_address, &info) == 0 || info.dli_fname == nullptr) return false;
  const char* slash = std::strrchr(info.dli_fname, '/');
  const char* name = slash != nullptr ? slash + 1 : info.dli_fname;
  return std::strncmp(name, "libnccl", 7) == 0;  // libnccl.so.2, and PyTorch's copy of it
}

}  // namespace vmmckpt::detail
