// XXH3 over image bytes, with the widest vector unit the CPU has: hashing every byte of a dump and
// of a restore is a large share of their CPU time.
#include "image_detail.hpp"

namespace vmmckpt::image::detail {

#if defined(VMMCKPT_CHECKSUM_AVX2)
void checksum_update_avx2(XXH3_state_t* state, const void* data, std::size_t size);  // checksum_avx2.cpp

namespace {
using update_fn = void (*)(XXH3_state_t*, const void*, std::size_t);
void update_portable(XXH3_state_t* state, const void* data, std::size_t size) { XXH3_64bits_update(state, data, size); }
update_fn choose() {
  __builtin_cpu_init();  // this may run before the constructors that would have done it
  return __builtin_cpu_supports("avx2") ? checksum_update_avx2 : update_portable;
}
}  // namespace

void checksum_update(XXH3_state_t* state, const void* data, std::size_t size) {
  static const update_fn update = choose();
  update(state, data, size);
}
#else
void checksum_update(XXH3_state_t* state, const void* data, std::size_t size) { XXH3_64bits_update(state, data, size); }
#endif

}  // namespace vmmckpt::image::detail
