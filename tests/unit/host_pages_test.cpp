// host_pages: staging memory that is aligned for huge pages and already present, page by page.
#include "vmmckpt/support/host_pages.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <cstdint>
#include <utility>
#include <vector>

namespace {

constexpr std::size_t huge_page = 2u << 20;

// How many of the pages under [data, data + size) are resident.
std::size_t resident_pages(const void* data, std::size_t size) {
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> in((size + page - 1) / page);
  REQUIRE(::mincore(const_cast<void*>(data), size, in.data()) == 0);
  std::size_t n = 0;
  for (unsigned char v : in) n += v & 1;
  return n;
}

}  // namespace

TEST_CASE("host_pages of no size holds nothing") {
  vmmckpt::host_pages none(0, 4);
  CHECK(none.data() == nullptr);
  CHECK(none.size() == 0);
}

TEST_CASE("host_pages are aligned, zeroed and every page present, whatever the threads and the size") {
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  for (unsigned threads : {1u, 3u, 8u}) {
    // A size that does not divide into the threads' slices, and one smaller than a huge page.
    for (std::size_t size : {9 * huge_page + 5 * page, 3 * page}) {
      CAPTURE(threads, size);
      vmmckpt::host_pages pages(size, threads);
      REQUIRE(pages.data() != nullptr);
      CHECK(pages.size() == size);
      CHECK(reinterpret_cast<std::uintptr_t>(pages.data()) % huge_page == 0);
      CHECK(resident_pages(pages.data(), size) == (size + page - 1) / page);
      const auto* bytes = static_cast<const unsigned char*>(pages.data());
      bool zero = true;
      for (std::size_t at = 0; at < size; at += page / 2) zero = zero && bytes[at] == 0;
      CHECK(zero);
    }
  }
}

TEST_CASE("host_pages move: the memory goes with it, once") {
  vmmckpt::host_pages a(huge_page, 2);
  void* data = a.data();
  REQUIRE(data != nullptr);
  vmmckpt::host_pages b(std::move(a));
  CHECK(a.data() == nullptr);
  CHECK(b.data() == data);
  vmmckpt::host_pages c;
  c = std::move(b);
  CHECK(b.data() == nullptr);
  CHECK(c.data() == data);
  CHECK(c.size() == huge_page);
}
