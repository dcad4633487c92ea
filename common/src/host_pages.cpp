// Anonymous, huge-page-aligned, pre-faulted host memory for pinned staging.
#include "vmmckpt/host_pages.hpp"

#include <sys/mman.h>

#include <cstdint>
#include <cstring>
#include <utility>

namespace vmmckpt {
namespace {
constexpr std::size_t huge_page = 2u << 20;
}

host_pages::host_pages(std::size_t size) {
  if (size == 0) return;
  // Over-map by one huge page so that the used part can start on a huge-page boundary.
  map_size_ = (size + 2 * huge_page - 1) / huge_page * huge_page;
  map_ = ::mmap(nullptr, map_size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    return;
  }
  const auto at = (reinterpret_cast<std::uintptr_t>(map_) + huge_page - 1) / huge_page * huge_page;
  data_ = reinterpret_cast<void*>(at);
  size_ = size;
  ::madvise(data_, size_, MADV_HUGEPAGE);  // advice only: 4 KiB pages work too
#ifdef MADV_POPULATE_WRITE
  if (::madvise(data_, size_, MADV_POPULATE_WRITE) == 0) return;
#endif
  std::memset(data_, 0, size_);  // kernels before 5.14: fault the pages in by touching them
}

host_pages::~host_pages() {
  if (map_ != nullptr) ::munmap(map_, map_size_);
}

host_pages::host_pages(host_pages&& o) noexcept
    : map_(std::exchange(o.map_, nullptr)),
      map_size_(std::exchange(o.map_size_, 0)),
      data_(std::exchange(o.data_, nullptr)),
      size_(std::exchange(o.size_, 0)) {}

host_pages& host_pages::operator=(host_pages&& o) noexcept {
  if (this != &o) {
    if (map_ != nullptr) ::munmap(map_, map_size_);
    map_ = std::exchange(o.map_, nullptr);
    map_size_ = std::exchange(o.map_size_, 0);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

}  // namespace vmmckpt
