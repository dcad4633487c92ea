// The in-process logger and status idiom never throw, even when every allocation fails (its own executable:
// it replaces operator new).
#include <catch2/catch.hpp>

#include <stdlib.h>

#include <cstdlib>
#include <new>
#include <string>

#include "vmmckpt/support/log.hpp"
#include "vmmckpt/support/status.hpp"

namespace {
thread_local bool fail_allocations = false;
}  // namespace

// Replacing the global allocation functions pairs new with malloc and delete with free, by design.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

void* operator new(std::size_t n) {
  if (fail_allocations) throw std::bad_alloc();
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

TEST_CASE("logging and failure statuses survive allocation failure", "[log]") {
  char path[] = "/tmp/vmmckpt-log-XXXXXX";
  const int fd = ::mkstemp(path);
  REQUIRE(fd >= 0);
  ::setenv("VMMCKPT_LOG_FILE", path, 1);
  ::setenv("VMMCKPT_LOG_LEVEL", "trace", 1);
  const std::string long_text(4096, 'x');  // beyond any small-string buffer

  // A message formatted while every allocation fails is dropped; the caller goes on (the functions
  // are noexcept: anything thrown out of them would end this test with std::terminate).
  fail_allocations = true;
  vmmckpt::log::error("first message, which also creates the logger: {}", long_text);
  vmmckpt::log::warn("{} {}", long_text, 42);
  const vmmckpt::status s = vmmckpt::failure(CUDA_ERROR_OUT_OF_MEMORY, "cannot map {}", long_text);
  fail_allocations = false;
  REQUIRE_FALSE(s.ok());
  REQUIRE(s.code() == CUDA_ERROR_OUT_OF_MEMORY);
  REQUIRE(s.message() == "out of memory");

  // And logging works again once memory is back.
  vmmckpt::log::warn("after: {}", 7);
  const vmmckpt::status t = vmmckpt::failure(CUDA_ERROR_INVALID_VALUE, "bad {}", "value");
  REQUIRE(t.message() == "bad value");
  ::unlink(path);
}
