// Program-made VMM memory shared between processes under the shim (docs/vmm.md, "Shared between processes"):
// NCCL's transports export a rank's buffers as POSIX FDs and the peer ranks import and map them.
//
// The exporting shim marks each FD it gives out with its pid (F_SETOWN, kept by the open file that travels
// with the FD) and keeps a duplicate for a while; the importing shim asks the FD's owner which handle it is
// (vmm_identify), so that its images record the import by exporter and token instead of lacking it, and a
// restore can map it again (vmm_share). The exporter knows who maps its memory, and refuses a suspend while
// they do.
#pragma once

#include <cuda.h>
#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <variant>
#include <vector>

#include "vmmckpt/protocol/control_messages.hpp"
#include "vmmckpt/pool/vmm_layout.hpp"
#include "vmmckpt/support/status.hpp"

namespace vmmckpt::detail {

// ---- the exporting side
// cuMemExportToShareableHandle gave out `fd` for the owned handle `token`.
void note_export(std::uint64_t token, int fd) noexcept;
// vmm_identify from process `importer`, with the FD it imported.
std::variant<control::vmm_share_reply, control::failure_reply> identify_export(int fd, pid_t importer);
// vmm_share from process `importer`: a new FD of `token` in `fds` (the caller sends and closes it).
std::variant<control::vmm_share_reply, control::failure_reply> share_handle(std::uint64_t token, pid_t importer,
                                                                            std::vector<int>& fds);
// vmm_unshare from process `importer`.
void unshare_handle(std::uint64_t token, pid_t importer) noexcept;
// The live processes that map this process's VMM memory now.
std::vector<pid_t> vmm_importers();
// A suspend: the duplicates kept of the FDs given out are closed. No import of memory about to be given back may
// be identified, and a whole-process checkpoint must find no descriptor of the driver's open (CRIU cannot take one).
void forget_exports() noexcept;

// ---- the importing side
// Which process and handle an FD being imported comes from: nothing when its owner is no process under the
// shim that gave it out (the import is then counted as lacking, as before). Asks before the import.
std::optional<vmm_import> identify_import(int fd) noexcept;
// Tells each exporter that this process maps those handles no more.
void tell_unshared(const std::vector<vmm_import>& dropped) noexcept;
// A restore or a job's resume: the exporter's handle imported again (a new FD asked for by vmm_share), the
// driver's handle in `real`; or why not (not logged: the caller says what it leaves unmapped). An exporter whose
// pid is among `job_ranks` is taken whatever its start time (a job restored by CRIU starts its processes anew),
// once it says the handle is the one recorded (its size and GPU).
status import_again(const vmm_import& x, CUmemGenericAllocationHandle& real,
                    const std::vector<std::int64_t>& job_ranks) noexcept;

}  // namespace vmmckpt::detail
