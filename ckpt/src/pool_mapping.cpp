// A dumped process's pool memory mapped into this process at the same addresses, through exported handles.
#include "vmmckpt/ckpt/pool_mapping.hpp"

#include <unistd.h>

#include "cuda_check.hpp"
#include "vmmckpt/hex_text.hpp"

namespace vmmckpt::ckpt {

pool_mapping::pool_mapping(CUdevice device, std::uint64_t base, std::uint64_t size, std::vector<segment_fd> segments)
    : base_(base), size_(size) {
  try {
    CUdeviceptr got = 0;
    VMMCKPT_CUDA_TRY(cuMemAddressReserve(&got, size, 0, base, 0));
    reserved_ = true;
    if (got != base) {
      cuMemAddressFree(got, size);
      reserved_ = false;
      throw tool_error("cannot map the pool at " + hex(base) + " in this process: the range is taken");
    }
    CUmemAccessDesc access{};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = device;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    for (auto& s : segments) {
      if (s.addr < base || s.addr + s.size > base + size || s.addr + s.size < s.addr)
        throw tool_error("segment " + hex(s.addr) + " lies outside the pool");
      CUmemGenericAllocationHandle handle = 0;
      const CUresult imported = cuMemImportFromShareableHandle(
          &handle, reinterpret_cast<void*>(static_cast<std::intptr_t>(s.fd)), CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
      ::close(s.fd);
      s.fd = -1;
      VMMCKPT_CUDA_TRY(imported);
      const CUresult map = cuMemMap(s.addr, s.size, 0, handle, 0);
      if (map != CUDA_SUCCESS) cuMemRelease(handle);
      VMMCKPT_CUDA_TRY(map);
      mapped_.push_back({s.addr, s.size, handle});
      VMMCKPT_CUDA_TRY(cuMemSetAccess(s.addr, s.size, &access, 1));
    }
  } catch (...) {
    for (auto& s : segments)
      if (s.fd >= 0) ::close(s.fd);
    release();
    throw;
  }
}

pool_mapping::~pool_mapping() { release(); }

void pool_mapping::release() {
  for (const auto& m : mapped_) {
    cuMemUnmap(m.addr, m.size);
    cuMemRelease(m.handle);
  }
  mapped_.clear();
  if (reserved_) cuMemAddressFree(base_, size_);
  reserved_ = false;
}

bool pool_mapping::covers(std::uint64_t addr, std::uint64_t size) const {
  std::uint64_t cursor = addr;
  const std::uint64_t end = addr + size;
  while (cursor < end) {
    bool found = false;
    for (const auto& m : mapped_) {
      if (m.addr <= cursor && cursor < m.addr + m.size) {
        cursor = m.addr + m.size;
        found = true;
        break;
      }
    }
    if (!found) return false;
  }
  return true;
}

}  // namespace vmmckpt::ckpt
