// Tags a program gives the memory it allocates (vmmckpt_set_tag, vmmckpt.h), as serving programs tag their weights
// and their KV cache: every allocation a thread makes while its tag is set carries that tag, and a pause treats each
// tag's memory as the caller asks (its bytes kept in host memory, or dropped). Pool blocks are known by their
// address, the program's VMM memory by its handle's token.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace vmmckpt::detail {

// The most distinct tags a program may use, and the longest tag.
inline constexpr std::size_t max_tags = 256;
inline constexpr std::size_t max_tag_length = 64;

// Set once any thread has set a tag: until then allocation and free skip the tag table (one relaxed load).
inline std::atomic<bool> any_memory_tagged{false};

// The calling thread's tag from now on; "" for none. An empty string, or why not (a bad tag, too many tags).
std::string set_thread_tag(const std::string& tag);
// The calling thread's tag, "" for none.
std::string thread_tag();

enum class tagged_kind { pool_block, vmm_handle };

// Records the calling thread's tag, if it has one, for a new pool block at `key` or a new VMM handle `key`; a key
// made again untagged loses its old tag. Never throws: memory the table cannot hold stays untagged, logged.
// Released handles' entries are dropped now and then, those for which `live` (called under the table's lock, so
// it must not call back here) says the token is gone: tokens are never made again, so they are only stale.
void tag_new(tagged_kind kind, std::uint64_t key, const std::function<bool(std::uint64_t)>& live = {}) noexcept;
// A pool block freed: its address no longer carries a tag.
void untag_block(std::uint64_t addr) noexcept;
// The tag of a pool block or a VMM handle, "" when it has none.
std::string tag_of(tagged_kind kind, std::uint64_t key);

}  // namespace vmmckpt::detail
