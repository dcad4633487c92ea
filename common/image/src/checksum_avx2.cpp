// XXH3's AVX2 kernel, built with -mavx2 and called only where the CPU has AVX2 (checksum.cpp).
// XXH_INLINE_ALL makes every XXH3 function static here, so this copy stays apart from the portable one.
#include "image_detail.hpp"

namespace vmmckpt::image::detail {

void checksum_update_avx2(XXH3_state_t* state, const void* data, std::size_t size) {
  XXH3_64bits_update(state, data, size);
}

}  // namespace vmmckpt::image::detail
