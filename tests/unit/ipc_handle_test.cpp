// Unit tests of the IPC handle bytes the shim gives out for pool memory (docs/ipc.md).
#include <catch2/catch.hpp>

#include <cstring>

#include "vmmckpt/protocol/ipc_handle.hpp"

using namespace vmmckpt;

TEST_CASE("an IPC handle survives its 64 bytes, and bytes not ours are told apart", "[ipc]") {
  const ipc_handle h{4242, 123456789, 0x200004000000, 8 << 20, 7};
  unsigned char bytes[ipc_handle_size];
  std::memset(bytes, 0xee, sizeof bytes);
  encode_ipc_handle(h, bytes);
  const auto back = decode_ipc_handle(bytes);
  REQUIRE(back.has_value());
  CHECK(*back == h);

  SECTION("any changed byte makes it not ours") {
    for (std::size_t i = 0; i < ipc_handle_size; ++i) {
      unsigned char changed[ipc_handle_size];
      std::memcpy(changed, bytes, sizeof bytes);
      changed[i] ^= 0x01;
      INFO("byte " << i);
      CHECK_FALSE(decode_ipc_handle(changed).has_value());
    }
  }
  SECTION("zeros, garbage and handles naming nothing are not ours") {
    unsigned char other[ipc_handle_size] = {};
    CHECK_FALSE(decode_ipc_handle(other).has_value());
    std::memset(other, 0x5a, sizeof other);
    CHECK_FALSE(decode_ipc_handle(other).has_value());
    for (ipc_handle bad : {ipc_handle{0, 1, 0x200000000000, 1, 1}, ipc_handle{1, 1, 0x200000000000, 0, 1},
                           ipc_handle{1, 1, 0x200000000000, 1, 0}}) {
      encode_ipc_handle(bad, other);
      CHECK_FALSE(decode_ipc_handle(other).has_value());
    }
  }
}
