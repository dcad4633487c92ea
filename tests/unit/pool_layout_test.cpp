// Unit tests of size parsing and pool configuration from the environment.
#include <catch2/catch.hpp>

#include <cstdlib>

#include "vmmckpt/pool/pool_layout.hpp"

using namespace vmmckpt;

TEST_CASE("sizes parse in hex, decimal and binary units", "[config]") {
  std::uint64_t v = 0;
  REQUIRE(parse_size("0x200000000000", v));
  REQUIRE(v == 0x200000000000ULL);
  REQUIRE(parse_size("4096", v));
  REQUIRE(v == 4096);
  REQUIRE(parse_size("64M", v));
  REQUIRE(v == 64ULL << 20);
  REQUIRE(parse_size("2GiB", v));
  REQUIRE(v == 2ULL << 30);
  REQUIRE(parse_size("1t", v));
  REQUIRE(v == 1ULL << 40);
  REQUIRE(parse_size("0X1f", v));
  REQUIRE(v == 31);
  REQUIRE(parse_size("3kb", v));
  REQUIRE(v == 3 * 1024);
  REQUIRE(parse_size("0", v));
  REQUIRE(v == 0);
  for (const char* bad : {"", "x", "0x", "12Q", "1GiBx", "1Gb2", "K", "0x1G", "1G2", "-5", "0xfffffffffffffffff",
                          "99999999999999999999", "20000000T"})
    REQUIRE_FALSE(parse_size(bad, v));
}

TEST_CASE("the environment overrides the pool and bad values are named", "[config]") {
  std::string error;
  ::unsetenv("VMMCKPT_POOL_BASE");
  ::unsetenv("VMMCKPT_POOL_SIZE");
  auto cfg = pool_config_from_env(error);
  REQUIRE(error.empty());
  REQUIRE(cfg.base == default_pool_base);
  REQUIRE(cfg.device_base(1) == default_pool_base + default_pool_size);

  ::setenv("VMMCKPT_POOL_BASE", "0x400000000000", 1);
  ::setenv("VMMCKPT_POOL_SIZE", "64G", 1);
  cfg = pool_config_from_env(error);
  REQUIRE(error.empty());
  REQUIRE(cfg.base == 0x400000000000ULL);
  REQUIRE(cfg.size == 64ULL << 30);

  ::setenv("VMMCKPT_POOL_BASE", "0x400000000001", 1);
  pool_config_from_env(error);
  REQUIRE(error.find("VMMCKPT_POOL_BASE") != std::string::npos);

  ::setenv("VMMCKPT_POOL_BASE", "banana", 1);
  pool_config_from_env(error);
  REQUIRE(error.find("banana") != std::string::npos);

  ::setenv("VMMCKPT_POOL_BASE", "0x7f8000000000", 1);  // 16 pools would leave user space
  pool_config_from_env(error);
  REQUIRE(error.find("128 TiB") != std::string::npos);

  ::unsetenv("VMMCKPT_POOL_BASE");
  ::unsetenv("VMMCKPT_POOL_SIZE");

  REQUIRE(pool_config_from_env(error).thread_cache_bytes == default_thread_cache_bytes);
  ::setenv("VMMCKPT_THREAD_CACHE", "0", 1);  // no caches
  cfg = pool_config_from_env(error);
  REQUIRE(error.empty());
  REQUIRE(cfg.thread_cache_bytes == 0);
  ::setenv("VMMCKPT_THREAD_CACHE", "many", 1);
  pool_config_from_env(error);
  REQUIRE(error.find("VMMCKPT_THREAD_CACHE") != std::string::npos);
  ::unsetenv("VMMCKPT_THREAD_CACHE");
}
