// Parsing and validation of the pool configuration from the environment.
#include "vmmckpt/pool/pool_layout.hpp"

#include <cstdlib>
#include <limits>

#include "vmmckpt/support/hex_text.hpp"

namespace vmmckpt {

namespace {

// The shift of a unit suffix: K, M, G or T, then an optional "i" and an optional "B", any case ("" is 0).
// -1 when it is not one.
int unit_shift(std::string_view unit) {
  if (unit.empty()) return 0;
  int shift;
  switch (unit[0]) {
    case 'k':
    case 'K': shift = 10; break;
    case 'm':
    case 'M': shift = 20; break;
    case 'g':
    case 'G': shift = 30; break;
    case 't':
    case 'T': shift = 40; break;
    default: return -1;
  }
  unit.remove_prefix(1);
  if (!unit.empty() && (unit[0] == 'i' || unit[0] == 'I')) unit.remove_prefix(1);  // "GiB"-style
  if (!unit.empty() && (unit[0] == 'b' || unit[0] == 'B')) unit.remove_prefix(1);
  return unit.empty() ? shift : -1;
}

}  // namespace

bool parse_size(std::string_view text, std::uint64_t& out) {
  if (text.size() > 2 && text[0] == '0' && (text[1] == 'x' || text[1] == 'X')) return parse_address(text, out);
  std::uint64_t value = 0;
  std::size_t i = 0;
  for (; i < text.size() && text[i] >= '0' && text[i] <= '9'; ++i) {
    const unsigned digit = text[i] - '0';
    if (value > (std::numeric_limits<std::uint64_t>::max() - digit) / 10) return false;
    value = value * 10 + digit;
  }
  const int shift = unit_shift(text.substr(i));
  if (i == 0 || shift < 0 || value > (std::numeric_limits<std::uint64_t>::max() >> shift)) return false;
  out = value << shift;
  return true;
}

namespace {

bool read_env(const char* name, std::uint64_t& field, std::string& error) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return true;
  if (!parse_size(text, field)) {
    error = std::string(name) + "='" + text + "' is not a size (use 0x hex, or decimal with K/M/G/T)";
    return false;
  }
  return true;
}

}  // namespace

std::string validate(const pool_config& config) {
  constexpr std::uint64_t user_space_end = 1ULL << 47;  // x86-64 and 48-bit arm64 user space
  if (config.base % large_alignment != 0) return "VMMCKPT_POOL_BASE must be a multiple of 2 MiB";
  if (config.size == 0 || config.size % large_alignment != 0)
    return "VMMCKPT_POOL_SIZE must be a non-zero multiple of 2 MiB";
  if (config.base == 0) return "VMMCKPT_POOL_BASE must not be 0";
  if (config.size > user_space_end / max_devices || config.base > user_space_end - config.size * max_devices)
    return "VMMCKPT_POOL_BASE + 16 * VMMCKPT_POOL_SIZE must stay below 128 TiB (user address space)";
  if (config.growth_step == 0) return "VMMCKPT_GROWTH_STEP must be non-zero";
  return {};
}

std::string validate(const vmm_config& config, const pool_config& pools) {
  constexpr std::uint64_t user_space_end = 1ULL << 47;
  if (config.base == 0 || config.base % large_alignment != 0)
    return "VMMCKPT_VMM_BASE must be a non-zero multiple of 2 MiB";
  if (config.window == 0 || config.window % large_alignment != 0)
    return "VMMCKPT_VMM_WINDOW must be a non-zero multiple of 2 MiB";
  if (config.window > user_space_end / max_devices || config.base > user_space_end - config.window * max_devices)
    return "VMMCKPT_VMM_BASE + 16 * VMMCKPT_VMM_WINDOW must stay below 128 TiB (user address space)";
  // Bounded above (and by validate(pools) for the pools, when they are valid): no overflow.
  const std::uint64_t windows_end = config.base + config.window * max_devices;
  const bool pools_fit =
      pools.size <= user_space_end / max_devices && pools.base <= user_space_end - pools.size * max_devices;
  const std::uint64_t pools_end = pools_fit ? pools.base + pools.size * max_devices : user_space_end;
  if (config.base < pools_end && pools.base < windows_end)
    return "the VMM windows [VMMCKPT_VMM_BASE, + 16 * VMMCKPT_VMM_WINDOW) overlap the pools [VMMCKPT_POOL_BASE, "
           "+ 16 * VMMCKPT_POOL_SIZE)";
  return {};
}

vmm_config vmm_config_from_env(const pool_config& pools, std::string& error) {
  vmm_config config;
  error.clear();
  if (!read_env(env_vmm_base, config.base, error) || !read_env(env_vmm_window, config.window, error)) return config;
  error = validate(config, pools);
  return config;
}

pool_config pool_config_from_env(std::string& error) {
  pool_config config;
  error.clear();
  if (!read_env(env_pool_base, config.base, error) || !read_env(env_pool_size, config.size, error) ||
      !read_env("VMMCKPT_GROWTH_STEP", config.growth_step, error) ||
      !read_env("VMMCKPT_POOL_RETAIN", config.retain_bytes, error) ||
      !read_env("VMMCKPT_THREAD_CACHE", config.thread_cache_bytes, error))
    return config;
  error = validate(config);
  return config;
}

}  // namespace vmmckpt
