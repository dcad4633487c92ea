// Program-made VMM memory in checkpoints: described to cuda-ckpt, handed over for a dump, given back for a
// suspend, and rebuilt for a resume or a restore (docs/vmm.md). The registry says what; this file makes the
// driver calls.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "vmmckpt/protocol/control_messages.hpp"
#include "vmmckpt/image/image.hpp"
#include "vmmckpt/support/status.hpp"

namespace vmmckpt::detail {

// hello: one summary of kind vmm per device window that holds reservations.
std::vector<control::pool_summary> vmm_summaries();

// dump_begin, the program held, before anything is handed over: waits for the work on every device whose
// window holds reservations (its primary context), as the pools do for theirs.
void vmm_synchronize() noexcept;

// How many handles a dump exports at most (one descriptor each).
std::size_t vmm_handle_count();

// dump_begin, the program held: appends one pool of kind vmm per device window that holds reservations
// (its allocations the window's mappings), sets r.vmm to the layout, and appends each handle's POSIX FD
// to `fds` in the layout's handle order. An empty string, or why it failed (the FDs appended so far are
// the caller's to close). Throws only for want of memory.
std::string vmm_hold_contents(control::dump_begin_reply& r, std::vector<int>& fds);

// suspend, the program held: every owned mapping unmapped and every owned handle's memory given back to
// the driver; reservations, tokens and the record of mappings and access stay. Returns the bytes freed.
std::uint64_t vmm_release_physical() noexcept;

// A job's suspend (docs/job-checkpoint.md), the program held: every mapping of another rank's memory unmapped and
// its driver handle given back, so that the exporter's suspend frees that memory; the records stay, and the
// program's import tokens with them. Returns the bytes no longer mapped.
std::uint64_t vmm_drop_imports() noexcept;
// A job's resume, every rank's memory loaded: each import given back mapped again from its exporter, where it
// was, with its access rights. The exporters among `job_ranks` may have new start times (a restore). Stops at
// the first that fails, saying which; those mapped again stay so, and a later call maps the others.
status vmm_map_imports_again(const std::vector<std::int64_t>& job_ranks) noexcept;

// vmmckpt_pause (self_pause.cpp): the program's owned mappings, for their bytes to be kept before
// vmm_release_physical(). Throws only for want of memory.
struct vmm_mapped_range {
  int device;
  std::uint64_t addr, size;
  std::uint64_t token;  // the handle mapped there
};
std::vector<vmm_mapped_range> vmm_mapped_ranges();

// peek by map (docs/peek.md): the POSIX FD of the handle mapped under [addr, addr + size), which must lie in one
// mapping of the program's, in `fd`, and where the range lies in that handle in `piece`. An empty string, or why
// not (no FD is left open then).
std::string vmm_export_range(std::uint64_t addr, std::uint64_t size, control::peek_piece& piece, int& fd);

// The mappings a suspend keeps in place (host memory, release_locked): a resume does not write their bytes
// from the image, which may be older than what the program's CPU threads wrote there since. Address order.
std::vector<std::pair<std::uint64_t, std::uint64_t>> vmm_kept_ranges();

// vmmckpt_resume: memory again under every token the registry holds, mapped where it was, with its access
// rights. On failure, what was made is given back.
status vmm_back_released() noexcept;

// resume: the image's VMM layout must be the suspended program's; every handle's memory is created again
// under its token, mapped where it was, with its access rights. On failure, what was made is given back.
status vmm_back_suspended(const image::manifest& m) noexcept;

// Restoring an image into a new process, before the program makes any VMM call: the reservations at
// their addresses, the handles under their tokens, mapped with their access rights. The registry must be
// empty and its windows the image's.
status vmm_restore_layout(const image::manifest& m) noexcept;

// Restoring an image into a new process with --replay: the program makes its VMM memory again itself (the
// registry starts empty, and the same calls give the same addresses and tokens). Each image mapping's bytes
// are written back when the program has mapped the same handle token at the same address, size and offset
// and given access to it (vmm_replay_fill, from cuMemSetAccess). Keeps the reader for that.
status vmm_prepare_replay(const std::string& image, const image::manifest& m) noexcept;
struct vmm_state;
// After cuMemSetAccess over [addr, addr + size) under the registry's lock: fills the image mappings wholly
// inside it that the program has made again exactly. A failure is logged and leaves that memory as the
// driver gave it.
void vmm_replay_fill(vmm_state& s, std::uint64_t addr, std::uint64_t size) noexcept;

}  // namespace vmmckpt::detail
