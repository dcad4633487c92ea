// The control channel's messages: one request and one reply type per op, encoded and decoded here for both ends.
//
// docs/protocol.md describes each op; tests/unit/control_messages_test.cpp checks that document against
// example_messages() below. Decoding is strict (every field named, typed and bounded) and throws
// json_fields::decode_error naming the field; encoding never fails on valid input. Fields a newer
// peer adds are ignored, as docs/protocol.md promises.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "vmmckpt/pool/alloc_api.hpp"
#include "vmmckpt/pool/ipc_imports.hpp"
#include "vmmckpt/support/json_fields.hpp"
#include "vmmckpt/pool/vmm_layout.hpp"
#include "vmmckpt/support/device_description.hpp"

namespace vmmckpt::control {

using json_fields::decode_error;

enum class op {
  hello,
  dump_begin,
  dump_end,
  suspend,
  resume,
  check,
  ipc_open,
  ipc_close,
  vmm_identify,
  vmm_share,
  vmm_unshare,
  cut_arm,
  cut_targets,
  cut_release,
  peek,
  poke,
  regions
};
inline constexpr op all_ops[] = {op::hello,       op::dump_begin, op::dump_end,    op::suspend,      op::resume,
                                 op::check,       op::ipc_open,   op::ipc_close,   op::vmm_identify, op::vmm_share,
                                 op::vmm_unshare, op::cut_arm,    op::cut_targets, op::cut_release,  op::peek,
                                 op::poke,        op::regions};
std::string_view name_of(op o);

// Why the process refused a request: what the tool acts on. The reply's text says it to a person.
enum class refusal {
  failed,         // the operation itself failed (an export, not enough memory for resume, ...)
  bad_request,    // not a request this process understands (malformed, a missing field)
  unknown_op,     // an op this process does not know
  suspended,      // dump or suspend of a suspended process
  not_suspended,  // resume of a running process
  not_held,       // dump_end or suspend with no hold in progress (its deadline passed)
  not_quiesced,   // the program's work did not drain before the deadline
  busy,           // another operation (a dump, suspend or resume) held the process until the deadline
  expired,        // the request arrived after the time it was valid until: nothing was done
  withdrawn,      // suspend: the tool had withdrawn the request (its claim was gone): nothing was done
};
std::string_view name_of(refusal r);

// Milliseconds since the Unix epoch now: what valid_until_ms is measured in.
std::int64_t unix_ms_now() noexcept;

// paused: the program gave its GPU memory back itself (vmmckpt_pause, shim/include/vmmckpt/vmmckpt.h).
enum class process_state { running, suspended, paused };
std::string_view name_of(process_state s);

// What the control server is doing for a tool right now, so that `cuda-ckpt ps` can show it: held
// for a dump, suspending (held for a suspend, or freeing memory), or resuming.
enum class activity { idle, dumping, suspending, resuming };
std::string_view name_of(activity a);

// Live device memory of the program that the shim does not own, so that no image holds it: what a
// dump must say it lacks. Only kinds with live bytes are listed, named by these strings.
namespace not_owned_kind {
inline constexpr std::string_view managed = "managed";
inline constexpr std::string_view arrays = "arrays";
inline constexpr std::string_view memory_pools = "memory pools";
inline constexpr std::string_view vmm_host = "VMM on host";
inline constexpr std::string_view vmm_other = "VMM of other kinds";
inline constexpr std::string_view vmm_imported = "imported VMM";
inline constexpr std::string_view vmm_unmapped = "VMM handles mapped nowhere";
}  // namespace not_owned_kind
struct not_owned_memory {
  std::string kind;
  std::uint64_t bytes = 0;
  friend bool operator==(const not_owned_memory&, const not_owned_memory&) = default;
};

// ---- requests ----
struct hello_request {
  // A dump or suspend is coming: the program lists its allocations now, while it runs, so that the
  // hold can use the list when nothing was allocated or freed since (optional; false when absent).
  bool prepare_hold = false;
  friend bool operator==(const hello_request&, const hello_request&) = default;
};
// Requests that change the process carry the time they are valid until, in milliseconds since the
// Unix epoch (a clock the tool and the program share even across PID and time namespaces): a request
// that waited in the socket while the program was stopped is refused, not acted on late.
// A suspend of one rank of a whole job (docs/job-checkpoint.md), sent with the hold: whether the job is
// suspended is decided by one claim file for all of its ranks, so that a rank whose tool goes away mid-way
// ends up as the others do.
struct job_suspend {
  std::string dir;                  // the job's image directory, which holds its claim (suspend_claim.hpp)
  std::string image;                // this rank's image, as it will be once committed
  std::string image_id;             // its manifest's image_id
  std::vector<std::int64_t> ranks;  // every rank's pid: its importers among them do not refuse the suspend
  friend bool operator==(const job_suspend&, const job_suspend&) = default;
};
struct dump_begin_request {
  std::chrono::milliseconds hold_deadline{60'000};  // the longest the program may be held (1 ms to 1 h)
  std::int64_t valid_until_ms = 0;
  bool for_suspend = false;  // "purpose" on the wire: what the program reports while held (optional; dump)
  std::optional<control::job_suspend> job;  // "job": a suspend of a job's rank (optional; with for_suspend)
  friend bool operator==(const dump_begin_request&, const dump_begin_request&) = default;
};
struct dump_end_request {
  friend bool operator==(const dump_end_request&, const dump_end_request&) = default;
};
struct suspend_request {
  std::string image;     // absolute path of the image just written and checked
  std::string image_id;  // its manifest's image_id: resume takes only this image
  std::int64_t valid_until_ms = 0;
  friend bool operator==(const suspend_request&, const suspend_request&) = default;
};
struct resume_request {
  std::int64_t valid_until_ms = 0;
  // The tool shows progress: the process sends progress frames while it loads (optional; false when
  // absent, and a process older than the field sends none).
  bool progress = false;
  // Load from this directory instead of the one suspend recorded (optional; empty when absent): a whole
  // process restored by CRIU finds its image where `cuda-ckpt restore DIR` says, on another machine too.
  // The image_id must still be the one suspend took.
  std::string image;
  // A job's resume comes in two stages (docs/job-checkpoint.md): every rank loads its memory (`load`, the
  // program still held), then each maps its peers' memory again and goes on (`finish`). Absent: both.
  enum class stage { both, load, finish };
  stage step = stage::both;
  // finish: the job's ranks, whose memory this one maps again; after a restore their start times changed.
  std::vector<std::int64_t> ranks;
  friend bool operator==(const resume_request&, const resume_request&) = default;
};
struct check_request {
  friend bool operator==(const check_request&, const check_request&) = default;
};
// Another process under the shim opens a CUDA IPC handle this process gave out (docs/ipc.md): the
// allocation at `base` as exported under `generation`.
struct ipc_open_request {
  std::uint64_t base = 0;
  std::uint64_t generation = 0;
  friend bool operator==(const ipc_open_request&, const ipc_open_request&) = default;
};
// That process closed it (cuIpcCloseMemHandle), or is going away.
struct ipc_close_request {
  std::uint64_t base = 0;
  std::uint64_t generation = 0;
  friend bool operator==(const ipc_close_request&, const ipc_close_request&) = default;
};
// Another process under the shim imported program-made VMM memory of this one (a POSIX FD, the frame's one
// descriptor, that cuMemExportToShareableHandle gave out here): which handle it is (docs/vmm.md, "Shared
// between processes").
struct vmm_identify_request {
  friend bool operator==(const vmm_identify_request&, const vmm_identify_request&) = default;
};
// Another process restores a mapping of this one's handle `token`: a new POSIX FD of it.
struct vmm_share_request {
  std::uint64_t token = 0;
  friend bool operator==(const vmm_share_request&, const vmm_share_request&) = default;
};
// That process maps the handle no more, or is going away.
struct vmm_unshare_request {
  std::uint64_t token = 0;
  friend bool operator==(const vmm_unshare_request&, const vmm_unshare_request&) = default;
};

// ---- the cut of a multi-rank job (docs/job-checkpoint.md) ----
// What a process issued on one NCCL communicator: its collectives (init and split included) and its
// point-to-point operations by peer rank. Also a target: what the tool asks the process to have issued.
struct peer_count {
  int peer = 0;
  std::uint64_t count = 0;
  friend bool operator==(const peer_count&, const peer_count&) = default;
};
struct comm_count {
  std::uint64_t id = 0;  // the communicator's identity across the job (a hash of its unique id)
  int rank = 0;          // this process's rank in it
  int size = 0;          // its ranks (0 in a target)
  std::uint64_t ops = 0;
  std::vector<peer_count> sends, recvs;  // by peer, ascending; peers with none left out
  friend bool operator==(const comm_count&, const comm_count&) = default;
};
// From now on, until the connection closes, cut_release, or hold_deadline passes: a thread about to issue an
// NCCL operation waits once the process has issued its targets (none yet: at its next one). The connection
// then carries cut_status frames whenever the process's state changes.
struct cut_arm_request {
  std::chrono::milliseconds hold_deadline{60'000};  // the longest the process stays armed (1 ms to 1 h)
  std::int64_t valid_until_ms = 0;
  friend bool operator==(const cut_arm_request&, const cut_arm_request&) = default;
};
struct cut_targets_request {
  std::vector<comm_count> targets;  // matched to the process's communicators by id and rank
  // Every rank stands at its targets: making a communicator waits too, so that nothing starts before the hold
  // (optional; false when absent).
  bool freeze = false;
  friend bool operator==(const cut_targets_request&, const cut_targets_request&) = default;
};
struct cut_release_request {
  friend bool operator==(const cut_release_request&, const cut_release_request&) = default;
};

// ---- the CPU's window into the live program's memory (docs/peek.md) ----
// How the bytes read or written relate to the program's work: `live` while it runs (unordered: a kernel may be
// writing them meanwhile), `ordered` after the work already submitted on its devices, `quiesce` with the program
// held at the dump's gate for the copy alone.
enum class peek_order { live, ordered, quiesce };
std::string_view name_of(peek_order o);
// How a peek's bytes reach the reader: `copy`, copied by the program into a sealed memfd (the reader needs no
// CUDA), or `map`, the descriptors of the memory itself, which the reader maps into its own context.
enum class peek_path { copy, map };
std::string_view name_of(peek_path p);
inline constexpr std::uint64_t max_peek_copy = 1ULL << 30;  // a copy of more is refused: map it instead

// The range: `size` bytes at `addr`, or, when `name` is given, at the range the program named so
// (vmmckpt_name) and `addr` an offset into it. Size 0: to the end of the allocation (or named range).
struct peek_request {
  std::uint64_t addr = 0;
  std::uint64_t size = 0;
  std::string name;  // optional
  peek_order order = peek_order::live;
  peek_path via = peek_path::copy;
  std::chrono::milliseconds hold_deadline{10'000};  // quiesce: the longest the program may be held
  std::int64_t valid_until_ms = 0;
  friend bool operator==(const peek_request&, const peek_request&) = default;
};
// Writes the frame's one descriptor, a sealed memfd of exactly `size` bytes, at the range (as peek's).
struct poke_request {
  std::uint64_t addr = 0;
  std::uint64_t size = 0;
  std::string name;
  peek_order order = peek_order::quiesce;
  std::chrono::milliseconds hold_deadline{10'000};
  std::int64_t valid_until_ms = 0;
  friend bool operator==(const poke_request&, const poke_request&) = default;
};
// What there is to peek at: every allocation, and the ranges the program named.
struct regions_request {
  friend bool operator==(const regions_request&, const regions_request&) = default;
};

using request = std::variant<hello_request, dump_begin_request, dump_end_request, suspend_request, resume_request,
                             check_request, ipc_open_request, ipc_close_request, vmm_identify_request,
                             vmm_share_request, vmm_unshare_request, cut_arm_request, cut_targets_request,
                             cut_release_request, peek_request, poke_request, regions_request>;

// ---- replies ----
struct pool_summary {
  int device = 0;
  std::uint64_t base = 0, size = 0;
  std::uint64_t live_bytes = 0, live_count = 0, backed_bytes = 0;
  // Program-made VMM memory in the device's VMM window (kind "vmm" on the wire): live bytes are its
  // mapped bytes, live_count its mappings, backed_bytes its handles' bytes.
  bool vmm = false;
  friend bool operator==(const pool_summary&, const pool_summary&) = default;
};
struct hello_reply {
  std::uint32_t protocol = 0;
  std::int64_t pid = 0;
  std::vector<std::string> command;
  process_state state = process_state::running;
  std::string image;  // the suspend image; only when suspended
  std::vector<device_description> devices;
  std::vector<pool_summary> pools;
  std::vector<not_owned_memory> not_owned;      // as the process counts it now (empty when absent)
  control::activity activity = activity::idle;  // idle when absent (an older process)
  // Of the owned bytes, those NCCL made (its buffers and pools): 0 when absent.
  std::uint64_t nccl_bytes = 0;
  friend bool operator==(const hello_reply&, const hello_reply&) = default;
};

struct segment_entry {  // mapped physical memory; one descriptor each, in order across pools
  std::uint64_t addr = 0, size = 0;
  friend bool operator==(const segment_entry&, const segment_entry&) = default;
};
struct pool_contents {
  int device = 0;
  std::uint64_t base = 0, size = 0, granularity = 0;
  // The live allocations travel apart, in the allocation table (a descriptor after the segments'):
  // a program of a million small blocks would otherwise send 60 MB of JSON while it is held.
  // The reply carries allocation_count (the sender sets it to allocations.size()); the table's
  // records fill allocations (decode_allocation_table).
  std::uint64_t allocation_count = 0;
  std::vector<allocation> allocations;
  std::vector<segment_entry> segments;
  // Program-made VMM memory in the device's VMM window (kind "vmm" on the wire): allocations are its
  // mappings (api cuMemMap), segments are none; the reply's `vmm` has its layout.
  bool vmm = false;
  friend bool operator==(const pool_contents&, const pool_contents&) = default;
};
struct dump_begin_reply {
  // Descriptors in all, this frame's and those of the fds frames after it: one per segment, in
  // order across pools, then one per handle of `vmm` (its POSIX FD), then one for the allocation table.
  std::uint32_t fd_count = 0;
  std::chrono::milliseconds hold_deadline{0};  // how long the program is held at most, from the hold's start
  std::vector<device_description> devices;
  std::vector<pool_contents> pools;
  // The program-made VMM memory the shim owns, when there is any: its bytes are the pools of kind vmm.
  std::optional<vmm_layout> vmm;
  // Taken while held, so exact: what an image of this hold lacks (empty when absent).
  std::vector<not_owned_memory> not_owned;
  // Other processes' memory mapped here through CUDA IPC (empty when absent).
  std::vector<vmmckpt::ipc_import> ipc_imports;
  friend bool operator==(const dump_begin_reply&, const dump_begin_reply&) = default;
};
// Follows a dump_begin reply when it has more descriptors than one frame may carry.
struct fds_frame {
  std::uint32_t count = 0;
  friend bool operator==(const fds_frame&, const fds_frame&) = default;
};
// Sent before the reply of a resume that asked for progress, at most ten a second while the image loads.
struct progress_frame {
  std::uint64_t bytes_done = 0;
  std::uint64_t bytes_total = 0;
  friend bool operator==(const progress_frame&, const progress_frame&) = default;
};
struct dump_end_reply {
  std::uint64_t held_us = 0;
  friend bool operator==(const dump_end_reply&, const dump_end_reply&) = default;
};
struct device_usage {
  int device = 0;
  std::uint64_t used_bytes_after = 0;
  friend bool operator==(const device_usage&, const device_usage&) = default;
};
struct suspend_reply {
  std::uint64_t freed_bytes = 0;
  std::uint64_t held_us = 0;
  std::vector<device_usage> devices;
  friend bool operator==(const suspend_reply&, const suspend_reply&) = default;
};
struct resume_reply {
  std::uint64_t bytes = 0;
  double seconds = 0;
  std::string image;
  friend bool operator==(const resume_reply&, const resume_reply&) = default;
};
struct check_reply {
  bool consistent = true;
  std::vector<std::string> problems;
  friend bool operator==(const check_reply&, const check_reply&) = default;
};
// The physical memory under an exported allocation: the whole handles under it, one descriptor per piece in
// order, each mapped from its start at `offset` in the importer's mapping (the driver maps imported handles
// only from their start). The allocation's base lies at base_offset in that mapping.
struct ipc_piece {
  std::uint64_t offset = 0, size = 0;
  friend bool operator==(const ipc_piece&, const ipc_piece&) = default;
};
struct ipc_open_reply {
  std::string device_uuid;  // the exporter's GPU ("GPU-..."; empty when unknown)
  std::uint64_t base_offset = 0;
  std::vector<ipc_piece> pieces;
  friend bool operator==(const ipc_open_reply&, const ipc_open_reply&) = default;
};
struct ipc_close_reply {
  friend bool operator==(const ipc_close_reply&, const ipc_close_reply&) = default;
};
// vmm_identify and vmm_share: the handle, by its token here, with its size and where its memory lives
// (vmm_share sends its POSIX FD with the reply).
struct vmm_share_reply {
  std::uint64_t token = 0;
  std::uint64_t size = 0;
  std::string device_uuid;  // the GPU the memory is on ("GPU-..."), or empty for memory on the host
  friend bool operator==(const vmm_share_reply&, const vmm_share_reply&) = default;
};
struct vmm_unshare_reply {
  friend bool operator==(const vmm_unshare_reply&, const vmm_unshare_reply&) = default;
};
// The cut's state in one process: the answer to each cut request, and a frame of its own whenever it changes.
struct cut_status {
  bool armed = false;
  int waiting = 0;    // threads waiting at an NCCL call
  int in_flight = 0;  // NCCL calls past the cut's check that have not returned (a group counts from its start)
  std::string where;  // the NCCL function a thread waits in ("" when none does)
  std::vector<comm_count> comms;
  friend bool operator==(const cut_status&, const cut_status&) = default;
};
// Where a peeked or poked range lies: its device, the allocation (or VMM mapping) that holds it, and the name
// of the named range that holds it, if one does.
struct peek_range {
  std::uint64_t addr = 0, size = 0;
  int device = 0;
  std::uint64_t allocation = 0, allocation_size = 0;
  std::string name;
  friend bool operator==(const peek_range&, const peek_range&) = default;
};
// map: one descriptor per piece, in order: the range's bytes [addr, addr + size) lie at `offset` in the memory of
// a handle of `handle_size` bytes (the driver maps an imported handle whole).
struct peek_piece {
  std::uint64_t addr = 0, size = 0, offset = 0, handle_size = 0;
  friend bool operator==(const peek_piece&, const peek_piece&) = default;
};
// copy: the bytes are the reply's one descriptor, a sealed memfd of range.size bytes.
struct peek_reply {
  peek_range range;
  peek_order order = peek_order::live;
  peek_path via = peek_path::copy;
  std::uint64_t held_us = 0;  // quiesce: how long the program was held
  std::vector<peek_piece> pieces;
  friend bool operator==(const peek_reply&, const peek_reply&) = default;
};
struct poke_reply {
  peek_range range;
  std::uint64_t held_us = 0;
  friend bool operator==(const poke_reply&, const poke_reply&) = default;
};
struct named_range {
  std::string name;
  std::uint64_t addr = 0, size = 0;
  friend bool operator==(const named_range&, const named_range&) = default;
};
// The pools without segments; their allocations in the allocation table, the reply's one descriptor.
struct regions_reply {
  std::vector<pool_contents> pools;
  std::vector<named_range> names;
  friend bool operator==(const regions_reply&, const regions_reply&) = default;
};
inline constexpr std::size_t max_names = 4096;       // named ranges a program may have
inline constexpr std::size_t max_name_length = 128;  // bytes of a name

// Any request's negative reply.
struct failure_reply {
  refusal code = refusal::failed;
  std::string error;
  friend bool operator==(const failure_reply&, const failure_reply&) = default;
};

// ---- encoding ----
std::string encode(const request& r);
std::string encode(const hello_reply& r);
std::string encode(const dump_begin_reply& r);
std::string encode(const fds_frame& r);
std::string encode(const progress_frame& r);
std::string encode(const dump_end_reply& r);
std::string encode(const suspend_reply& r);
std::string encode(const resume_reply& r);
std::string encode(const check_reply& r);
std::string encode(const ipc_open_reply& r);
std::string encode(const ipc_close_reply& r);
std::string encode(const vmm_share_reply& r);
std::string encode(const vmm_unshare_reply& r);
std::string encode(const cut_status& r);
std::string encode(const peek_reply& r);
std::string encode(const poke_reply& r);
std::string encode(const regions_reply& r);
std::string encode(const failure_reply& r);

// ---- decoding ----
// A request, or a failure_reply (bad_request or unknown_op) to send back.
std::variant<request, failure_reply> decode_request(const std::string& payload);

// A reply of type Reply, or the process's refusal. Throws decode_error when the payload is neither.
template <typename Reply>
std::variant<Reply, failure_reply> decode_reply(const std::string& payload);
fds_frame decode_fds_frame(const std::string& payload);
// A progress frame; nothing when the payload is another message (the reply that ends the op). Throws
// decode_error for a malformed progress frame.
std::optional<progress_frame> decode_progress_frame(const std::string& payload);

// The allocation table of a dump_begin reply: every pool's allocations in order, as fixed records
// (little_endian.hpp's allocation_record). The process sends it as a sealed memfd.
// (regions sends the same for its pools.)
std::string encode_allocation_table(const std::vector<pool_contents>& pools);
// The same into `out`, allocation_table_bytes(pools) long (a mapped memfd: no copy of a large table).
std::size_t allocation_table_bytes(const std::vector<pool_contents>& pools);
void encode_allocation_table(const std::vector<pool_contents>& pools, unsigned char* out);
// Fills every pool's allocations from the table, which must hold exactly allocation_count records
// for each; decode_error when it does not, or names an API vmmckpt does not record.
void decode_allocation_table(std::string_view table, std::vector<pool_contents>& pools);
// A name a program may give a range: 1 to max_name_length printable ASCII bytes, no spaces; not a number (so
// that `peek PID NAME` is never an address).
bool valid_range_name(std::string_view name);

// One fully populated example of each message, per op, for the protocol document's check and the
// round-trip tests: the request and its reply as encoded.
struct example {
  op operation;
  std::string request;
  std::string reply;
};
std::vector<example> example_messages();
std::string example_failure();
std::string example_fds_frame();
std::string example_progress_frame();

}  // namespace vmmckpt::control
