// The shim's initialisation, at library load, before any CUDA call: the control server is to start when the
// program first gets memory the shim serves (core/first_use.hpp), not for every process the shim is preloaded
// into (a launcher, a shell) that never uses CUDA.
#include "core/first_use.hpp"
#include "operations/control_server.hpp"

namespace {

__attribute__((constructor)) void start_shim() noexcept {
  vmmckpt::detail::on_first_served_memory(vmmckpt::detail::start_control_server);
}

}  // namespace
