// Anonymous, huge-page-aligned, pre-faulted host memory for pinned staging.
#include "vmmckpt/support/host_pages.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace vmmckpt {
namespace {
constexpr std::size_t huge_page = 2u << 20;
}

host_pages::host_pages(std::size_t size, unsigned threads) {
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
  if (threads == 0) return;  // faulted in as written: small pages, so that what is never written takes nothing
  ::madvise(data_, size_, MADV_HUGEPAGE);  // advice only: 4 KiB pages work too
  // Slices of whole huge pages, one per thread.
  const std::size_t slices = std::max<std::size_t>(1, std::min<std::size_t>(threads, size_ / huge_page));
  const std::size_t slice = (size_ / slices + huge_page - 1) / huge_page * huge_page;
  // Each page is faulted in by a write to it, not by MADV_POPULATE_WRITE: that holds the process's mmap
  // lock while it zeroes the pages, and a CUDA context made meanwhile (the driver maps much memory) took
  // 390-430 ms instead of 215-235 on an H100 host; touching took 30-36 ms for 1 GiB of huge pages
  // against 110-190, and left the context as fast as alone (docs/benchmarks-incremental-h100.md).
  const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  auto populate = [&](std::size_t k) {
    auto* p = static_cast<volatile unsigned char*>(data_) + k * slice;
    const std::size_t n = std::min(slice, size_ - std::min(size_, k * slice));
    for (std::size_t at = 0; at < n; at += page) p[at] = 0;
  };
  std::vector<std::thread> helpers;
  for (std::size_t k = 1; k < slices; ++k) helpers.emplace_back(populate, k);
  populate(0);
  for (auto& t : helpers) t.join();
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

namespace {

// A number in a file of /proc or /sys (after `skip` characters); 0 when missing or not a number ("max").
std::uint64_t number_in(const std::string& path, std::size_t skip = 0) {
  std::ifstream in(path);
  std::string text;
  std::getline(in, text);
  return text.size() > skip ? std::strtoull(text.c_str() + skip, nullptr, 10) : 0;
}

// What this process's cgroup (v2) still lets it have; 0 when it sets no limit.
std::uint64_t cgroup_room() {
  std::ifstream in("/proc/self/cgroup");
  std::string line;
  std::getline(in, line);  // "0::/PATH" under cgroup v2
  if (line.rfind("0::", 0) != 0) return 0;
  const std::string dir = "/sys/fs/cgroup" + line.substr(3);
  const std::uint64_t most = number_in(dir + "/memory.max"), used = number_in(dir + "/memory.current");
  return most == 0 ? 0 : most - std::min(most, used) + 1;  // +1: a full cgroup is not "no limit"
}

}  // namespace

std::uint64_t available_host_memory() {
  std::uint64_t available = 0;
  std::ifstream in("/proc/meminfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("MemAvailable:", 0) == 0) available = std::strtoull(line.c_str() + 13, nullptr, 10) << 10;  // kB
  const std::uint64_t room = cgroup_room();
  return room != 0 && (available == 0 || room < available) ? room : available;
}

}  // namespace vmmckpt
