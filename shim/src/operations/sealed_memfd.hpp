// Bytes handed to cuda-ckpt as a file it can map but nobody can change under its mapping: a memfd, filled through a
// mapping of its own and then sealed (no write, no shrink, no growth).
#pragma once

#include <cstddef>
#include <functional>

namespace vmmckpt::detail {

// A sealed memfd of `bytes` bytes, filled by `fill` (which returns false to give up); -1 with errno set when it
// cannot be made, or when fill gave up.
int sealed_memfd(const char* name, std::size_t bytes, const std::function<bool(unsigned char*)>& fill);

}  // namespace vmmckpt::detail
