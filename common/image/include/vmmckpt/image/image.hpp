// The checkpoint image: a directory holding a versioned manifest and the dumped bytes (docs/image-format.md).
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "vmmckpt/pool/alloc_api.hpp"
#include "vmmckpt/pool/ipc_imports.hpp"
#include "vmmckpt/pool/vmm_layout.hpp"
#include "vmmckpt/support/device_description.hpp"

namespace vmmckpt::image {

// What the writer writes: format 5, which adds block checksums and parents (incremental images) to
// format 4 (program-made VMM memory: the manifest's `vmm` layout and pools of kind vmm), which added to
// format 3, whose allocation and extent tables are apart from the manifest's JSON, in tables.bin.
// Readers also read formats 4, 3, 2 (tables in the JSON) and 1 (one data file, no `file` fields).
inline constexpr std::uint32_t format_version = 6;
// Format 6: a block whose bytes are all zero is stored nowhere and read as zeros (a zero block): images of
// programs that reserve more than they fill (JAX, vLLM) hold what the program really wrote.
// Format 5: every extent's stored bytes are cut into blocks of this many bytes, counted from the
// extent's first stored byte (the last block of an extent may be shorter), each with its own
// checksum: the unit an incremental dump compares with its parent and leaves out when unchanged.
// docs/image-format.md ("Blocks") gives the measurements behind 1 MiB.
inline constexpr std::uint64_t write_block_size = 1ULL << 20;
// The longest chain of parents a reader follows (an image, its parent, its parent's parent, ...).
inline constexpr std::size_t max_chain_length = 32;
// Data files an image may have: the writer spreads extents over several so that threads can
// write them at once (a file system serializes writes to one file).
inline constexpr std::uint32_t max_data_files = 256;

// Every defect an image can have is reported as this, with a message naming it.
struct image_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

using vmmckpt::allocation;

// A range of a pool's addresses whose allocations' bytes are stored together in one data file: the
// bytes of every allocation inside [addr, addr + size), in address order, packed (the gaps between
// allocations are not stored). It begins and ends inside allocations. One extent holds many small
// allocations, so that a dump of 200 000 of them costs about what one of the same bytes does; a big
// allocation is cut into several. In formats 1 and 2 every extent lies inside one allocation.
// Format 5: one block of an extent's stored bytes: its checksum (block_checksum), and whether its
// bytes are in this image's data file or, unchanged, in the parent's extent of the same address,
// size and stored bytes.
// Format 6: or a zero block, whose bytes are all zero, stored nowhere (its checksum is that of its zeros).
struct block {
  std::uint64_t checksum = 0;
  bool in_parent = false;
  bool zero = false;  // format 6; never with in_parent
  friend bool operator==(const block&, const block&) = default;
};

struct extent {
  std::uint64_t addr = 0;
  std::uint64_t size = 0;    // of the address range
  std::uint64_t stored = 0;  // bytes in the data file: the allocations' bytes in the range
  std::uint32_t file = 0;    // which data file holds it
  std::uint64_t offset = 0;  // in that file's payload
  // XXH3-64 of the stored bytes; format 5: combined_checksum(blocks)
  std::uint64_t checksum = 0;
  std::vector<block> blocks;  // format 5: block_count(stored, block size) of them
  friend bool operator==(const extent&, const extent&) = default;
};

// The block checksum function of format 5 (docs/image-format.md, "Blocks"): XXH3-64 with seed 0 of
// the block's bytes. A GPU kernel computing checksums must give exactly these values.
std::uint64_t block_checksum(const void* data, std::size_t size);
// An extent's checksum in format 5: XXH3-64 (seed 0) of its blocks' checksums, each as 8 bytes
// little-endian, in order.
std::uint64_t combined_checksum(const std::vector<block>& blocks);
// Blocks of `stored` bytes cut into blocks of `block_bytes` (the last may be shorter).
std::uint64_t block_count(std::uint64_t stored, std::uint64_t block_bytes);
// The bytes of extent e this image's data file holds: all its stored bytes but its blocks in the parent.
std::uint64_t bytes_here(const extent& e, std::uint64_t block_bytes);
// Format 6: the stored bytes of an extent's zero blocks (in no data file, read as zeros).
std::uint64_t zero_bytes(const extent& e, std::uint64_t block_bytes);
// The checksum of a block of `size` zero bytes: what a zero block records.
std::uint64_t zero_block_checksum(std::uint64_t size);

// `size` of an extent's stored bytes, from `offset` in them, belong at address `addr`: the part of
// one allocation inside the extent.
struct stored_run {
  std::uint64_t addr = 0, size = 0, offset = 0;
};

// What a pool's allocations are: blocks of the shim's pool at the process's pool layout, or (format 4)
// the mappings of program-made VMM memory in the device's VMM window, whose layout is the manifest's `vmm`.
enum class pool_kind { pool, vmm };

struct pool {
  pool_kind kind = pool_kind::pool;
  int device = 0;  // ordinal in the dumped process
  std::uint64_t base = 0, size = 0, granularity = 0;
  std::vector<allocation> allocations;  // sorted by address
  std::vector<extent> extents;          // sorted by address
  friend bool operator==(const pool&, const pool&) = default;
};

// Where each stored byte of extent `e` of pool `p` belongs, in address order. For a valid image.
std::vector<stored_run> stored_runs(const pool& p, const extent& e);

// Device memory the dumped program had that the image does not hold (docs/image-format.md,
// `lacking`): a kind as the shim names it ("managed", "arrays", ...) and its bytes at the dump.
struct lack {
  std::string kind;
  std::uint64_t bytes = 0;
  friend bool operator==(const lack&, const lack&) = default;
};

// Format 5: the image an incremental image takes its unchanged blocks from, by identity (its image_id
// and the XXH3-64 of its manifest.json as written) and by where it was found when the child was
// written (a hint: docs/image-format.md, "Chains", says where readers look).
struct parent_ref {
  std::string image_id;
  std::uint64_t manifest_checksum = 0;
  std::string path;
  friend bool operator==(const parent_ref&, const parent_ref&) = default;
};

struct manifest {
  std::uint32_t format = format_version;
  // Format 3: 32 hex digits, random, given by the writer at commit: which image this is, so that
  // resume takes only the image its own suspend wrote. Empty in older formats.
  std::string image_id;
  std::string tool_version;
  std::string created;  // ISO 8601, UTC
  std::string host;
  std::int64_t pid = 0;
  std::vector<std::string> command;
  std::vector<device_description> devices;
  std::vector<pool> pools;
  std::uint64_t data_bytes = 0;  // sum of the extents' bytes here (bytes_here) = sum of the data files' payloads
  std::uint64_t block_size = write_block_size;  // format 5 (what the writer writes); 0 before
  std::optional<parent_ref> parent;             // format 5: an incremental image's parent
  std::uint32_t data_files = 1;                 // data.bin, data.1.bin, ... data.(N-1).bin
  std::uint64_t hold_us = 0;                    // how long the program was held for the dump
  // Format 4: program-made VMM memory's reservations, handles, mappings and access; its bytes are in
  // the pools of kind vmm. Absent when the program made none.
  std::optional<vmm_layout> vmm;
  // Empty for a complete image; otherwise the image is partial (`--allow-partial`) and lacks these.
  std::vector<lack> lacking;
  // Memory the program mapped from other processes through CUDA IPC when dumped (none when absent).
  std::vector<vmmckpt::ipc_import> ipc_imports;  // its JSON: vmmckpt/ipc_imports.hpp
  friend bool operator==(const manifest&, const manifest&) = default;
};

// The bytes an image brings back: every extent's stored bytes, wherever in its chain they are
// (data_bytes counts only those in its own data files).
std::uint64_t restored_bytes(const manifest& m);
// The bytes its data files hold together, its data_bytes: every extent's bytes_here.
std::uint64_t data_bytes_of(const manifest& m);
// Format 6: the bytes of its zero blocks, in no data file.
std::uint64_t zero_bytes_of(const manifest& m);

// Writes an image under a temporary name next to `final_dir`; nothing at
// `final_dir` exists until commit() has written, fsync'd and renamed it. The
// destructor removes the temporary directory of an uncommitted image.
class writer {
 public:
  // Throws image_error if final_dir exists. `files` data files (1..max_data_files) are created.
  explicit writer(const std::filesystem::path& final_dir, std::uint32_t files = 1);
  ~writer();
  writer(const writer&) = delete;
  writer& operator=(const writer&) = delete;

  // Each data file takes extents one after another; each is begun, fed its `stored` bytes in order,
  // ended. Calls for different files may come from different threads at once; calls for one file
  // must not. Without `stored`, the extent lies in one allocation and stores all `size` bytes.
  void begin_extent(std::uint32_t file, std::uint64_t addr, std::uint64_t size, std::uint64_t stored);
  void begin_extent(std::uint32_t file, std::uint64_t addr, std::uint64_t size) {
    begin_extent(file, addr, size, size);
  }
  void write(std::uint32_t file, const void* data, std::size_t size);  // part of that file's current extent
  extent end_extent(std::uint32_t file);                               // file, offset, checksums filled in
  // Instead of write(), block by block (at a block boundary of the current extent; `size` is
  // write_block_size or the extent's last, shorter, block): a block whose checksum the caller has
  // computed already (block_checksum of these very bytes, on the CPU or the GPU), written unhashed;
  // or, with inherit_block, a block left out because the parent image holds it unchanged; or, with
  // zero_block, a block of zeros (the caller knows: the GPU found it). write() and write_blocks() also store a
  // whole block of zeros they are given as a zero block: no image holds a block of zeros in a data file.
  void write_block(std::uint32_t file, const void* data, std::size_t size, std::uint64_t checksum);
  // Several whole blocks at once (the extent's last may be shorter), one checksum each: one write().
  void write_blocks(std::uint32_t file, const void* data, std::size_t size, const std::uint64_t* checksums,
                    std::size_t count);
  void inherit_block(std::uint32_t file, std::size_t size, std::uint64_t checksum);
  void zero_block(std::uint32_t file, std::size_t size);
  // The same on file 0.
  void begin_extent(std::uint64_t addr, std::uint64_t size) { begin_extent(0, addr, size); }
  void write(const void* data, std::size_t size) { write(0, data, size); }
  extent end_extent() { return end_extent(0); }
  std::uint32_t files() const;
  // Seconds one data file's calls spent hashing and in write(), for reports of where a dump's time went.
  struct file_times {
    double hashing = 0;
    double writing = 0;
  };
  file_times times(std::uint32_t file) const;

  // The manifest's extents, taken file by file in manifest order, must be those end_extent
  // returned for that file, in order; data_files must be files(). The image is written with the
  // writer's own image_id (whatever m says; cheapest when m already has it). Returns the manifest's
  // checksum, by which a child names it (parent_ref).
  std::uint64_t commit(const manifest& m);
  const std::string& image_id() const;
  const std::filesystem::path& temporary_dir() const;
  // A small file of the caller's written into the image (synced with it, there from the moment the
  // image appears): suspend's claim file. Its name must not be one of the image's own.
  void add_file(const std::string& name, const std::string& contents);

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

// Reads and checks an image. open() validates the manifest completely (every
// rule in docs/image-format.md) before returning; read() verifies checksums.
class reader {
 public:
  static reader open(const std::filesystem::path& dir);
  reader(reader&&) noexcept;
  ~reader();
  const manifest& info() const;
  // Reads one extent's stored bytes into dst (e.stored bytes) and checks its checksum.
  void read(const extent& e, void* dst) const;
  // The bytes the image holds for [addr, addr + size), handed to `out` in address order, piece by
  // piece; every extent touched is read whole and its checksum checked before any of its bytes go
  // out. The whole range must lie in the image's allocations: otherwise image_error names the first
  // byte that does not, before anything is handed out.
  void read_range(std::uint64_t addr, std::uint64_t size,
                  const std::function<void(const unsigned char*, std::size_t)>& out) const;
  // Checks every extent's checksum on up to `threads` threads at once (0: one per core), each
  // taking the next extent of extents_across_files(); throws image_error naming a bad extent.
  void verify_data(unsigned threads = 0) const;
  // Every extent as (pool, index into its extents): the data files taken in turn (the first extent
  // of each, then the second of each, ...), each file's in the order they lie in it. Threads that
  // take the next one share the work evenly however the bytes fall into files, and read every
  // file front to back.
  std::vector<std::pair<std::size_t, std::size_t>> extents_across_files() const;
  // Checks that the manifest is the one the data files were written with (each header records its
  // XXH3); verify_data() does this first. Loaders that check extents themselves call it.
  void verify_manifest() const;
  // The XXH3-64 of manifest.json as read: what a child image records of its parent.
  std::uint64_t manifest_checksum() const;
  // Format 5: the parent this image's blocks in_parent are read from (opened, checked, with its own
  // parents, by open()); null for an image without one.
  const reader* parent() const;
  const std::filesystem::path& dir() const;
  // Compares a checksum a loader computed over a whole extent (streaming_checksum) with the
  // manifest's; throws image_error naming the extent when they differ.
  void check_extent(const extent& e, std::uint64_t computed) const;
  // Reads part of an extent's stored bytes without checking its checksum: for loaders that
  // stream big extents in pieces (and check them with check_extent). Blocks in the parent come from it.
  void read_part(const extent& e, std::uint64_t offset, std::uint64_t size, void* dst) const;

 private:
  struct impl;
  explicit reader(std::unique_ptr<impl>);
  // open() of one link of a chain: `children` names the images already opened below it, nearest last.
  static reader open_link(const std::filesystem::path& dir, std::vector<std::string>& children);
  std::unique_ptr<impl> impl_;
};

// XXH3-64 over bytes fed piece by piece: what an extent's checksum is, for loaders that stream. With
// a block size (format 5: the manifest's block_size), the combined checksum of its blocks instead.
class streaming_checksum {
 public:
  explicit streaming_checksum(std::uint64_t block_bytes = 0);
  ~streaming_checksum();
  streaming_checksum(const streaming_checksum&) = delete;
  streaming_checksum& operator=(const streaming_checksum&) = delete;
  void update(const void* data, std::size_t size);
  std::uint64_t value() const;
  // Block mode only. A block whose checksum is known (computed on the GPU, or the parent's): at a block
  // boundary, in place of its bytes.
  void add_block(const block& b);
  bool at_block_boundary() const;
  // Every block's checksum so far, the last shorter block included: an extent's `blocks`.
  std::vector<block> blocks() const;

 private:
  struct state;
  std::unique_ptr<state> state_;
};

// Checks every rule of docs/image-format.md that needs no data file (what reader::open and
// writer::commit apply); throws image_error naming the first defect, e.g.
// "pools[0].extents[3] overlaps extents[2]".
void validate(const manifest& m);

// The metadata files of a format 3 image for m, exactly as writer::commit writes them (with m's own
// image_id): manifest.json's text and tables.bin's bytes. For tests and tools that build images by hand.
struct metadata_files {
  std::string manifest_json;
  std::string tables;
};
metadata_files encode_metadata(const manifest& m);

// The manifest as JSON, its tables inline: what `inspect --json` prints, and what the manifest file
// of a format 1 or 2 image holds (a format 3 file keeps the tables apart, in tables.bin).
std::string to_json(const manifest& m, int indent = 2);
manifest from_json(const std::string& text);  // that form; structural checks only; throws image_error

// Opens `name` in the directory `dir_fd` for reading as the image readers do: never through a symbolic
// link, never blocking on a FIFO, a regular file only; image_error naming `path` otherwise. Returns the
// descriptor (the caller closes it) and its fstat in `st`, for sizes to be checked before anything is read.
int open_regular_file(int dir_fd, const std::string& name, const std::string& path, struct ::stat& st);

}  // namespace vmmckpt::image
