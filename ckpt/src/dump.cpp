// The dump engine: hold the program, map its pool here, copy live bytes out through pinned staging, write the image.
#include "vmmckpt/ckpt/dump.hpp"

#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <algorithm>
#include <deque>
#include <map>
#include <exception>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "cuda_check.hpp"
#include "vmmckpt/ckpt/control_client.hpp"
#include "vmmckpt/ckpt/pool_mapping.hpp"
#include "vmmckpt/fault_point.hpp"
#include "vmmckpt/host_pages.hpp"
#include "vmmckpt/protocol.hpp"
#include "vmmckpt/uuid_text.hpp"
#include "vmmckpt/version.hpp"

namespace vmmckpt::ckpt {
namespace {

using json = nlohmann::json;
using clock = std::chrono::steady_clock;

std::uint64_t parse_hex(const json& v) {
  if (v.is_number_unsigned()) return v.get<std::uint64_t>();
  return std::stoull(v.get<std::string>(), nullptr, 0);
}

std::string now_iso8601() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

std::string hostname() {
  char buf[256] = {};
  ::gethostname(buf, sizeof buf - 1);
  return buf;
}

// This process's device with the given UUID (ordinals differ when
// CUDA_VISIBLE_DEVICES does); the ordinal itself when no UUID is known.
CUdevice find_device(const json& dev) {
  int count = 0;
  VMMCKPT_CUDA_TRY(cuDeviceGetCount(&count));
  const std::string uuid = dev.value("uuid", "");
  for (int i = 0; i < count && !uuid.empty(); ++i) {
    CUdevice d;
    VMMCKPT_CUDA_TRY(cuDeviceGet(&d, i));
    CUuuid u{};
    if (cuDeviceGetUuid(&u, d) != CUDA_SUCCESS) continue;
    if (uuid == uuid_text(u.bytes)) return d;
  }
  const int ordinal = dev.value("ordinal", 0);
  if (ordinal >= count) throw tool_error("the program's device " + std::to_string(ordinal) + " is not visible here");
  CUdevice d;
  VMMCKPT_CUDA_TRY(cuDeviceGet(&d, ordinal));
  return d;
}

// A piece of an allocation, stored as one extent; big allocations are cut into chunk-sized
// extents so that several writer threads share them.
struct piece {
  std::size_t pool;    // index into the manifest's pools
  std::size_t extent;  // index into that pool's extents
  std::uint64_t addr;
  std::uint64_t size;
};
// One staging buffer's worth of pieces, copied back to back, written to one data file.
struct chunk {
  std::vector<piece> pieces;
  std::uint64_t bytes = 0;
};

// Cuts every pool's allocations into extents of at most chunk_bytes and packs them into chunks,
// in manifest order. Writers take chunks in that order, so each data file gets its extents in it.
std::vector<chunk> plan_chunks(image::manifest& m, std::uint64_t chunk_bytes, std::uint32_t files) {
  std::vector<chunk> chunks(1);
  for (std::size_t p = 0; p < m.pools.size(); ++p) {
    auto& pool = m.pools[p];
    pool.extents.clear();
    for (const auto& a : pool.allocations) {
      for (std::uint64_t done = 0; done < a.size;) {
        if (chunks.back().bytes == chunk_bytes) chunks.emplace_back();
        chunk& c = chunks.back();
        const std::uint64_t n = std::min(a.size - done, chunk_bytes - c.bytes);
        c.pieces.push_back({p, pool.extents.size(), a.addr + done, n});
        pool.extents.push_back({a.addr + done, n, 0, 0, 0});
        c.bytes += n;
        done += n;
      }
    }
  }
  if (chunks.back().bytes == 0) chunks.pop_back();
  m.data_files = files;  // a file whose writer takes no chunk stays empty
  return chunks;
}

// Pinned staging buffers and copy streams, released in every case. The buffers are one block of
// pre-faulted memory registered with the driver (much cheaper to pin than cuMemHostAlloc), or
// cuMemHostAlloc buffers where registering is refused.
struct staging {
  host_pages pages;
  bool registered = false;
  std::vector<void*> allocated;
  std::vector<unsigned char*> buffers;
  std::vector<CUevent> events;
  std::vector<CUstream> streams;

  // The pages alone (no CUDA call): faulted in while the tool's context is being made.
  void reserve(int count, std::size_t bytes) { pages = host_pages(static_cast<std::size_t>(count) * bytes, 8); }

  // With a current context: pins the reserved pages, or allocates pinned buffers instead.
  void allocate(int count, std::size_t bytes) {
    if (pages.size() != static_cast<std::size_t>(count) * bytes) reserve(count, bytes);
    if (pages.data() != nullptr && cuMemHostRegister(pages.data(), pages.size(), 0) == CUDA_SUCCESS) {
      registered = true;
      for (int i = 0; i < count; ++i) buffers.push_back(static_cast<unsigned char*>(pages.data()) + i * bytes);
    } else {
      pages = host_pages();
      for (int i = 0; i < count; ++i) {
        void* b = nullptr;
        VMMCKPT_CUDA_TRY(cuMemHostAlloc(&b, bytes, 0));
        allocated.push_back(b);
        buffers.push_back(static_cast<unsigned char*>(b));
      }
    }
    for (int i = 0; i < count; ++i) {
      CUevent e;
      VMMCKPT_CUDA_TRY(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING | CU_EVENT_BLOCKING_SYNC));
      events.push_back(e);
    }
  }
  ~staging() {
    for (CUstream s : streams) cuStreamSynchronize(s);
    if (registered) cuMemHostUnregister(pages.data());
    for (void* b : allocated) cuMemFreeHost(b);
    for (CUevent e : events) cuEventDestroy(e);
    for (CUstream s : streams) cuStreamDestroy(s);
  }
};

// Device memory in this tool's context holding a copy of the program's live bytes, or of as many of
// them as the device has room for.
struct gpu_snapshot {
  CUdeviceptr ptr = 0;
  std::uint64_t bytes = 0;
  // Up to `want` bytes, leaving a quarter of the device free: the program must not run out of
  // memory because a dump borrowed it. Less than `least` is not worth it.
  void try_allocate(std::uint64_t want, std::uint64_t least) {
    std::size_t free = 0, total = 0;
    if (cuMemGetInfo(&free, &total) != CUDA_SUCCESS || free <= total / 4) return;
    const std::uint64_t n = std::min<std::uint64_t>(want, (free - total / 4) & ~((2ULL << 20) - 1));
    if (n < least) return;
    if (cuMemAlloc(&ptr, n) != CUDA_SUCCESS) {
      ptr = 0;
      return;
    }
    bytes = n;
  }
  void release() {
    if (ptr != 0) {
      cuCtxSynchronize();  // no copy may still read it
      cuMemFree(ptr);
    }
    ptr = 0;
    bytes = 0;
  }
  ~gpu_snapshot() { release(); }
};

}  // namespace

int default_writers() {
  return static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 16u));
}

dump_result dump(const dump_options& options, const std::function<void(const dump_progress&)>& progress) {
  const auto start = clock::now();
  dump_result result;
  result.start = start;
  control_client client(options.pid);
  const json hello = client.call({{"op", "hello"}});
  fault_point("connected");
  if (hello.value("protocol", 0u) != protocol::version)
    throw tool_error("process " + std::to_string(options.pid) + " speaks protocol " +
                     std::to_string(hello.value("protocol", 0u)) + "; this cuda-ckpt speaks " +
                     std::to_string(protocol::version));

  if (hello.value("state", "") == "suspended")
    throw tool_error("process " + std::to_string(options.pid) + " is " +
                     (options.suspend ? "already suspended" : "suspended") + " (image " + hello.value("image", "?") +
                     ")" + (options.suspend ? "" : "; resume it first"));

  // Everything that can be prepared is prepared before the program is held:
  // the destination (fail early if unwritable), the CUDA context, and pinned
  // staging sized from the live bytes the program reported.
  std::uint64_t live_estimate = 0;
  for (const json& p : hello.value("pools", json::array())) live_estimate += p.value("live_bytes", std::uint64_t{0});
  // Enough buffers to take the whole dump when it fits the staging budget, so
  // the program is held only for the copy out of the GPU, not for the writes.
  const std::uint64_t wanted = (live_estimate + options.chunk_bytes - 1) / options.chunk_bytes;
  const std::uint64_t budget = std::max<std::uint64_t>(2, options.staging_bytes / options.chunk_bytes);
  const int buffers = static_cast<int>(std::clamp<std::uint64_t>(wanted, 2, budget));
  staging st;
  // The staging pages are faulted in while the driver makes the context (both take a while).
  std::thread reserving([&] { st.reserve(buffers, options.chunk_bytes); });
  struct join_on_exit {
    std::thread& t;
    ~join_on_exit() {
      if (t.joinable()) t.join();
    }
  } join_reserving{reserving};

  VMMCKPT_CUDA_TRY(cuInit(0));
  std::map<int, CUdevice> devices;  // the program's ordinal -> ours
  CUcontext context = nullptr;
  for (const json& p : hello.value("pools", json::array())) {
    const int ordinal = p.at("device").get<int>();
    json dev_info = {{"ordinal", ordinal}};
    for (const json& d : hello.value("devices", json::array()))
      if (d.value("ordinal", -1) == ordinal) dev_info = d;
    devices[ordinal] = find_device(dev_info);
    if (context == nullptr) {
      VMMCKPT_CUDA_TRY(cuDevicePrimaryCtxRetain(&context, devices[ordinal]));
      VMMCKPT_CUDA_TRY(cuCtxSetCurrent(context));
    }
  }
  if (context == nullptr) throw tool_error("process " + std::to_string(options.pid) + " has no GPU memory in the pool yet");
  result.mark("context");

  // The image's data files: one per writer thread, fewer for a small dump (an unusable
  // destination fails here, before the program is held).
  const std::uint64_t chunks_estimate = std::max<std::uint64_t>(1, (live_estimate + options.chunk_bytes - 1) / options.chunk_bytes);
  image::writer writer(options.output, static_cast<std::uint32_t>(std::clamp<std::uint64_t>(
                                            chunks_estimate, 1, std::clamp(options.writers, 1, int(image::max_data_files)))));

  reserving.join();
  st.allocate(buffers, options.chunk_bytes);
  for (int i = 0; i < std::max(1, options.streams); ++i) {
    CUstream s;
    VMMCKPT_CUDA_TRY(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    st.streams.push_back(s);
  }

  // With room on the GPU for a second copy of the live bytes, the program is held only while
  // they are copied there (at device speed, about 2 TB/s), then written out from the copy. With
  // room for part of them, the last chunks go there and the first straight out of the GPU.
  gpu_snapshot snapshot;
  if (!options.suspend && options.gpu_snapshot && devices.size() == 1)
    snapshot.try_allocate(live_estimate + live_estimate / 8 + (64ULL << 20), options.chunk_bytes);

  result.mark("prepared");
  std::vector<int> fds;
  struct fd_guard {
    std::vector<int>& fds;
    ~fd_guard() {
      for (int f : fds)
        if (f >= 0) ::close(f);
    }
  } guard{fds};
  const json held = client.call({{"op", "dump_begin"}, {"deadline_ms", options.hold_deadline_ms}}, &fds,
                                options.hold_deadline_ms + 5'000);
  // From here the program is held, until dump_end or this connection closes.
  fault_point("held");
  result.mark("held");

  image::manifest& m = result.manifest;
  m.tool_version = VMMCKPT_VERSION;
  m.created = now_iso8601();
  m.host = hostname();
  m.pid = options.pid;
  m.command = hello.value("command", std::vector<std::string>{});

  std::vector<std::unique_ptr<pool_mapping>> mappings;
  std::size_t next_fd = 0;
  for (const json& p : held.at("pools")) {
    const int ordinal = p.at("device").get<int>();
    json dev_info = {{"ordinal", ordinal}};
    for (const json& d : held.value("devices", json::array()))
      if (d.value("ordinal", -1) == ordinal) dev_info = d;
    if (!devices.count(ordinal)) devices[ordinal] = find_device(dev_info);  // a pool created since hello
    const CUdevice device = devices[ordinal];
    image::device_info info;
    info.ordinal = ordinal;
    info.name = dev_info.value("name", "");
    info.uuid = dev_info.value("uuid", "");
    info.cc_major = dev_info.value("cc_major", 0);
    info.cc_minor = dev_info.value("cc_minor", 0);
    m.devices.push_back(info);

    image::pool pool;
    pool.device = ordinal;
    pool.base = parse_hex(p.at("base"));
    pool.size = p.at("size").get<std::uint64_t>();
    pool.granularity = p.at("granularity").get<std::uint64_t>();
    std::vector<segment_fd> segments;
    for (const json& s : p.at("segments")) {
      if (next_fd >= fds.size()) throw tool_error("the program sent fewer handles than segments");
      segments.push_back({parse_hex(s.at("addr")), s.at("size").get<std::uint64_t>(), fds[next_fd]});
      fds[next_fd++] = -1;  // the mapping owns it now
    }
    mappings.push_back(std::make_unique<pool_mapping>(device, pool.base, pool.size, std::move(segments)));
    for (const json& a : p.at("allocations")) {
      image::allocation alloc{parse_hex(a.at("addr")), a.at("size").get<std::uint64_t>(), a.value("api", "")};
      if (!mappings.back()->covers(alloc.addr, alloc.size))
        throw tool_error("allocation at " + a.at("addr").get<std::string>() + " is not backed by the handles sent");
      pool.allocations.push_back(alloc);
    }
    m.pools.push_back(std::move(pool));
  }

  // The driver's cuCheckpointProcessLock is deliberately not taken as well: a
  // tool that dies holding it leaves the program locked for good (the driver
  // does not release it), and a crashed tool must never hang the program. The
  // shim's gate, which reopens when this connection drops, is the quiesce.

  // Copy: pinned buffers; this thread copies the chunks in order into whichever buffer is free,
  // and each writer thread (one data file each) takes the next copied chunk and appends it, so
  // PCIe and storage overlap and the file system takes several files at once (it serializes
  // writes to one file).
  const auto chunks = plan_chunks(m, options.chunk_bytes, writer.files());
  std::uint64_t total = 0;
  for (const auto& c : chunks) total += c.bytes;

  std::mutex mutex;
  std::condition_variable changed;
  std::size_t issued = 0;                       // chunks [0, issued) are copied or in flight
  std::size_t taken = 0;                        // chunks [0, taken) are taken by a writer
  std::vector<std::size_t> chunk_buffer(chunks.size());  // the staging buffer each chunk is copied into
  std::vector<std::size_t> free_buffers;
  for (int b = buffers - 1; b >= 0; --b) free_buffers.push_back(static_cast<std::size_t>(b));
  bool stop = false;                      // the dump is over (done or failed): writers leave
  std::exception_ptr writer_error;
  std::uint64_t written = 0;

  auto write_file = [&](std::uint32_t file) {
    double waiting = 0;
    struct add_on_exit {  // this thread's waits, summed into the result however it leaves
      double& waiting;
      std::mutex& mu;
      dump_result& result;
      ~add_on_exit() {
        std::lock_guard lock(mu);
        result.threads.waiting += waiting;
      }
    } add_waiting{waiting, mutex, result};
    try {
      VMMCKPT_CUDA_TRY(cuCtxSetCurrent(context));
      // Each writer takes the next copied chunk, whichever it is, and appends it to its own file: a
      // writer that falls behind holds up no other, nor the copies.
      for (;;) {
        const auto wait_start = clock::now();
        std::size_t c, b;
        {
          std::unique_lock lock(mutex);
          changed.wait(lock, [&] { return taken < issued || taken == chunks.size() || stop || writer_error; });
          if (stop || writer_error || taken == issued) return;
          c = taken++;
          b = chunk_buffer[c];
        }
        VMMCKPT_CUDA_TRY(cuEventSynchronize(st.events[b]));
        waiting += std::chrono::duration<double>(clock::now() - wait_start).count();
        const unsigned char* bytes = st.buffers[b];
        for (const piece& pc : chunks[c].pieces) {
          writer.begin_extent(file, pc.addr, pc.size);
          writer.write(file, bytes, pc.size);
          m.pools[pc.pool].extents[pc.extent] = writer.end_extent(file);
          bytes += pc.size;
        }
        std::uint64_t done;
        {
          std::lock_guard lock(mutex);
          free_buffers.push_back(b);
          done = written += chunks[c].bytes;
        }
        changed.notify_all();
        if (progress && file == 0) progress({done, total});
      }
    } catch (...) {
      std::lock_guard lock(mutex);
      if (!writer_error) writer_error = std::current_exception();
      changed.notify_all();
    }
  };
  std::vector<std::thread> writer_threads;
  for (std::uint32_t f = 0; f < m.data_files; ++f) writer_threads.emplace_back(write_file, f);
  struct joiner {
    std::vector<std::thread>& threads;
    std::mutex& mu;
    std::condition_variable& cv;
    bool& stop;
    ~joiner() {
      {
        std::lock_guard lock(mu);
        stop = true;
      }
      cv.notify_all();
      for (auto& t : threads)
        if (t.joinable()) t.join();
    }
  } join_writers{writer_threads, mutex, changed, stop};

  // The chunks that fit in the snapshot, counted from the end; those before them are copied out of
  // the GPU while the program is held (all of them when the program grew past the snapshot).
  std::size_t first_in_snapshot = chunks.size();
  for (std::uint64_t room = snapshot.bytes; first_in_snapshot > 0 && chunks[first_in_snapshot - 1].bytes <= room;)
    room -= chunks[--first_in_snapshot].bytes;
  if (first_in_snapshot == chunks.size()) snapshot.release();
  std::vector<CUdeviceptr> snapshot_at(chunks.size(), 0);  // where a chunk's bytes are in the snapshot
  bool released = false;
  auto release_program = [&] {
    if (const char* pause = std::getenv("VMMCKPT_TEST_PAUSE_HELD_MS"))  // fault tests: die while held
      std::this_thread::sleep_for(std::chrono::milliseconds(std::atoi(pause)));
    if (options.suspend) return;
    const json reply = client.call({{"op", "dump_end"}});
    fault_point("writing");
    result.hold_ms = reply.value("held_us", 0.0) / 1000.0;
    mappings.clear();
    released = true;
  };

  auto copy_start = clock::now();
  // Every byte is out of the program's memory (in the snapshot or on the host): let it go on.
  auto release_when_copied = [&] {
    for (CUstream s : st.streams) VMMCKPT_CUDA_TRY(cuStreamSynchronize(s));
    result.copy_seconds = std::chrono::duration<double>(clock::now() - copy_start).count();
    result.gpu_snapshot = true;
    release_program();
    result.mark("released");
  };
  if (snapshot.ptr != 0) {
    CUdeviceptr at = snapshot.ptr;
    for (std::size_t c = first_in_snapshot; c < chunks.size(); ++c) {
      snapshot_at[c] = at;
      for (const piece& pc : chunks[c].pieces) {
        VMMCKPT_CUDA_TRY(cuMemcpyDtoDAsync(at, pc.addr, pc.size, st.streams[0]));
        at += pc.size;
      }
      result.snapshot_bytes += chunks[c].bytes;
    }
    if (first_in_snapshot == 0) release_when_copied();
  }
  for (std::size_t c = 0; c < chunks.size(); ++c) {
    if (c == first_in_snapshot && c > 0) release_when_copied();
    std::size_t b;
    {
      const auto wait_start = clock::now();
      std::unique_lock lock(mutex);
      changed.wait(lock, [&] { return !free_buffers.empty() || writer_error; });
      result.threads.copy_waiting += std::chrono::duration<double>(clock::now() - wait_start).count();
      if (writer_error) break;
      b = free_buffers.back();
      free_buffers.pop_back();
      chunk_buffer[c] = b;
    }
    CUstream s = st.streams[c % st.streams.size()];
    if (snapshot_at[c] != 0) {
      VMMCKPT_CUDA_TRY(cuMemcpyDtoHAsync(st.buffers[b], snapshot_at[c], chunks[c].bytes, s));
    } else {
      std::uint64_t offset = 0;
      for (const piece& pc : chunks[c].pieces) {
        VMMCKPT_CUDA_TRY(cuMemcpyDtoHAsync(st.buffers[b] + offset, pc.addr, pc.size, s));
        offset += pc.size;
      }
    }
    VMMCKPT_CUDA_TRY(cuEventRecord(st.events[b], s));
    {
      std::lock_guard lock(mutex);
      issued = c + 1;
    }
    changed.notify_all();
    fault_point("copying");
  }
  // Every byte is out of the GPU once the copies are done: release the program
  // now, while the last buffers are still being written.
  for (CUstream s : st.streams) VMMCKPT_CUDA_TRY(cuStreamSynchronize(s));
  if (!result.gpu_snapshot) result.copy_seconds = std::chrono::duration<double>(clock::now() - copy_start).count();
  {
    std::lock_guard lock(mutex);
    if (writer_error) std::rethrow_exception(writer_error);
  }
  auto finish_writing = [&] {
    for (auto& t : writer_threads) t.join();
    if (writer_error) std::rethrow_exception(writer_error);
    result.threads.writers = static_cast<int>(m.data_files);
    for (std::uint32_t f = 0; f < m.data_files; ++f) {
      result.threads.hashing += writer.times(f).hashing;
      result.threads.writing += writer.times(f).writing;
    }
    if (progress) progress({total, total});
    m.data_bytes = total;
  };
  result.mark("copied");
  if (!released) {
    release_program();
    if (released) result.mark("released");
  }
  if (!options.suspend) {
    finish_writing();
    result.mark("written");
    m.hold_us = static_cast<std::uint64_t>(result.hold_ms * 1000.0);
    writer.commit(m);
    result.mark("committed");
  } else {
    // The program gives its memory back only once the image is complete and synced, and opens
    // with every rule checked (headers, sizes, the manifest's checksum). The checksums of the
    // bytes were taken from the very buffers written; reading them back (--verify) would read
    // the page cache, not the medium, so it is optional.
    mappings.clear();
    fault_point("writing");
    finish_writing();
    result.mark("written");
    writer.commit(m);
    result.mark("committed");
    const auto check = image::reader::open(options.output);
    check.verify_manifest();
    if (options.verify_before_suspend) check.verify_data();
    result.mark("verified");
    fault_point("verified");
    json suspended;
    try {
      suspended = client.call({{"op", "suspend"}, {"image", std::filesystem::absolute(options.output).string()}},
                              nullptr, 120'000);
    } catch (...) {
      std::error_code ec;
      std::filesystem::remove_all(options.output, ec);  // the program runs on; the image is no use
      throw;
    }
    fault_point("suspended");
    result.mark("suspended");
    result.hold_ms = suspended.value("held_us", 0.0) / 1000.0;
    result.freed_bytes = suspended.value("freed_bytes", std::uint64_t{0});
    for (const json& d : suspended.value("devices", json::array()))
      result.device_used_after += d.value("used_bytes_after", std::uint64_t{0});
  }
  result.image = options.output;
  result.seconds = std::chrono::duration<double>(clock::now() - start).count();
  return result;
}

resume_result resume(pid_t pid) {
  control_client client(pid);
  const json hello = client.call({{"op", "hello"}});
  if (hello.value("state", "") != "suspended")
    throw tool_error("process " + std::to_string(pid) + " is not suspended (state " + hello.value("state", "?") + ")");
  if (std::getenv("VMMCKPT_TEST_KILL_AT") != nullptr && std::strcmp(std::getenv("VMMCKPT_TEST_KILL_AT"), "resuming") == 0) {
    // Fault test: the request goes out, then the tool dies before the answer.
    std::vector<int> none;
    std::string error;
    protocol::send_frame(client.fd_for_tests(), json{{"op", "resume"}}.dump(), none, error);
    fault_point("resuming");
  }
  const json r = client.call({{"op", "resume"}}, nullptr, 600'000);
  return {r.value("bytes", std::uint64_t{0}), r.value("seconds", 0.0), r.value("image", "")};
}

}  // namespace vmmckpt::ckpt
