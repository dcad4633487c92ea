// Measures the limits a dump or restore runs into: host memory bandwidth, writing and reading
// files (tmpfs or disk) from several threads, pinning host memory, and the PCIe copy itself.
// Prints one JSON object per measurement, one per line, for bench/report.py.
//
// usage: vmmckpt_bench_limits [--dir DIR] [--bytes N] [--threads 1,4,8] [--no-gpu] [--only NAME,...]
#include <cuda.h>
#include <fcntl.h>
#define XXH_INLINE_ALL
#include <xxhash.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t) { return std::chrono::duration<double>(clock_type::now() - t).count(); }

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "vmmckpt_bench_limits: %s\n", what.c_str());
  std::exit(1);
}

void check(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return;
  const char* name = nullptr;
  cuGetErrorName(r, &name);
  die(std::string(what) + " failed: " + (name ? name : "?"));
}

void emit(const std::string& name, std::uint64_t bytes, int threads, double secs, const std::string& extra = "") {
  std::printf("{\"bench\":\"limits\",\"name\":\"%s\",\"bytes\":%llu,\"threads\":%d,\"seconds\":%.6f,\"gbps\":%.3f%s}\n",
              name.c_str(), static_cast<unsigned long long>(bytes), threads, secs, secs > 0 ? bytes / secs / 1e9 : 0.0,
              extra.c_str());
  std::fflush(stdout);
}

// Runs fn(k) on k = 0..threads-1 and returns the wall time of the slowest.
double parallel(int threads, const std::function<void(int)>& fn) {
  const auto t0 = clock_type::now();
  std::vector<std::thread> pool;
  for (int k = 0; k < threads; ++k) pool.emplace_back(fn, k);
  for (auto& t : pool) t.join();
  return seconds_since(t0);
}

void pwrite_all(int fd, const char* p, std::size_t n, off_t off) {
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, p, n, off);
    if (w <= 0) die(std::string("pwrite: ") + std::strerror(errno));
    p += w;
    n -= static_cast<std::size_t>(w);
    off += w;
  }
}

void pread_all(int fd, char* p, std::size_t n, off_t off) {
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, n, off);
    if (r <= 0) die(std::string("pread: ") + std::strerror(errno));
    p += r;
    n -= static_cast<std::size_t>(r);
    off += r;
  }
}

constexpr std::size_t io_piece = 32u << 20;  // what one write()/read() moves, as the image writer does

struct options {
  std::string dir = "/dev/shm";
  std::uint64_t bytes = 4ull << 30;
  std::vector<int> threads = {1, 4, 8, 12};
  bool gpu = true;
  std::set<std::string> only;
  bool wants(const std::string& n) const { return only.empty() || only.count(n) != 0; }
};

// Host memory bandwidth: threads copying disjoint halves of a buffer.
void bench_memcpy(const options& o, char* src, char* dst) {
  for (int t : o.threads) {
    const std::uint64_t share = o.bytes / t;
    const double s = parallel(t, [&](int k) { std::memcpy(dst + k * share, src + k * share, share); });
    emit("memcpy", share * t, t, s);
  }
}

// Writing a file set the way the image writer does: each thread appends to its own file,
// or (one_file) all threads write disjoint ranges of one file.
void bench_file_write(const options& o, const char* src, bool one_file) {
  for (int t : o.threads) {
    const std::uint64_t share = o.bytes / t / io_piece * io_piece;
    std::vector<std::string> paths;
    std::vector<int> fds;
    for (int k = 0; k < (one_file ? 1 : t); ++k) {
      paths.push_back(o.dir + "/vmmckpt-limits-" + std::to_string(::getpid()) + "-" + std::to_string(k));
      const int fd = ::open(paths.back().c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
      if (fd < 0) die(paths.back() + ": " + std::strerror(errno));
      fds.push_back(fd);
    }
    const double s = parallel(t, [&](int k) {
      const int fd = fds[one_file ? 0 : k];
      const off_t base = one_file ? static_cast<off_t>(k * share) : 0;
      for (std::uint64_t at = 0; at < share; at += io_piece) pwrite_all(fd, src + k * share + at, io_piece, base + at);
      ::fdatasync(fd);
    });
    emit(one_file ? "write_one_file" : "write_files", share * t, t, s);
    if (!one_file) {
      // Reading the same files back into memory (the page cache when on tmpfs or cached).
      std::vector<char> sink(io_piece * t);
      const double r = parallel(t, [&](int k) {
        for (std::uint64_t at = 0; at < share; at += io_piece)
          pread_all(fds[k], sink.data() + k * io_piece, io_piece, at);
      });
      emit("read_files", share * t, t, r);
      // The same bytes through a mapping of each file instead of read(): no system call per piece,
      // and the page cache's pages are mapped rather than looked up one by one.
      const double m = parallel(t, [&](int k) {
        void* map = ::mmap(nullptr, share, PROT_READ, MAP_SHARED | MAP_POPULATE, fds[k], 0);
        if (map == MAP_FAILED) die(std::string("mmap: ") + std::strerror(errno));
        for (std::uint64_t at = 0; at < share; at += io_piece)
          std::memcpy(sink.data() + k * io_piece, static_cast<const char*>(map) + at, io_piece);
        ::munmap(map, share);
      });
      emit("mmap_read_files", share * t, t, m);
    }
    for (int fd : fds) ::close(fd);
    for (auto& p : paths) ::unlink(p.c_str());
  }
}

// Copies that land in the files themselves: each thread sizes its own file in DIR (fallocate),
// maps it, registers the mapping with the driver and copies GPU memory straight into it, then
// hashes it as the image writer would; the reverse maps the same files, registers, hashes and
// copies back to the GPU. No write() or read() copies the bytes through the kernel.
void bench_direct(const options& o) {
  const int t = *std::max_element(o.threads.begin(), o.threads.end());
  const std::uint64_t share = o.bytes / t / io_piece * io_piece;
  CUdeviceptr d = 0;
  if (cuMemAlloc(&d, share * t) != CUDA_SUCCESS) return;
  check(cuMemsetD8(d, 7, share * t), "cuMemsetD8");
  check(cuCtxSynchronize(), "cuCtxSynchronize");
  CUcontext ctx;
  check(cuCtxGetCurrent(&ctx), "cuCtxGetCurrent");
  std::vector<std::string> paths(t);
  for (int k = 0; k < t; ++k)
    paths[k] = o.dir + "/vmmckpt-limits-direct-" + std::to_string(::getpid()) + "-" + std::to_string(k);
  std::vector<double> size_s(t), reg_s(t), copy_s(t), hash_s(t);
  auto phases = [&](const char* name, double total) {
    auto most = [](const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); };
    emit(name, share * t, t, total,
         ",\"size_seconds\":" + std::to_string(most(size_s)) + ",\"register_seconds\":" + std::to_string(most(reg_s)) +
             ",\"copy_seconds\":" + std::to_string(most(copy_s)) + ",\"hash_seconds\":" + std::to_string(most(hash_s)));
  };
  std::atomic<bool> failed{false};
  for (int dir = 0; dir < 2 && !failed; ++dir) {
    const double s = parallel(t, [&](int k) {
      cuCtxSetCurrent(ctx);
      auto t0 = clock_type::now();
      const int fd =
          ::open(paths[k].c_str(), dir == 0 ? O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC : O_RDWR | O_CLOEXEC, 0600);
      if (fd < 0 || (dir == 0 && ::fallocate(fd, 0, 0, static_cast<off_t>(share)) != 0)) {
        failed = true;
        if (fd >= 0) ::close(fd);
        return;
      }
      void* map = ::mmap(nullptr, share, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
      ::close(fd);
      if (map == MAP_FAILED) {
        failed = true;
        return;
      }
      size_s[k] = seconds_since(t0);
      t0 = clock_type::now();
      if (cuMemHostRegister(map, share, 0) != CUDA_SUCCESS) {
        failed = true;
        ::munmap(map, share);
        return;
      }
      reg_s[k] = seconds_since(t0);
      CUstream stream;
      cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING);
      auto copy = [&] {
        const auto c0 = clock_type::now();
        if (dir == 0)
          cuMemcpyDtoHAsync(map, d + k * share, share, stream);
        else
          cuMemcpyHtoDAsync(d + k * share, map, share, stream);
        cuStreamSynchronize(stream);
        copy_s[k] = seconds_since(c0);
      };
      auto hash = [&] {
        const auto h0 = clock_type::now();
        volatile XXH64_hash_t sink = XXH3_64bits(map, share);
        (void)sink;
        hash_s[k] = seconds_since(h0);
      };
      if (dir == 0) {
        copy();
        hash();
      } else {
        hash();
        copy();
      }
      cuStreamDestroy(stream);
      cuMemHostUnregister(map);
      ::munmap(map, share);
    });
    if (!failed) phases(dir == 0 ? "direct_dtoh_files" : "direct_htod_files", s);
  }
  if (failed) emit("direct_dtoh_files", share * t, t, 0, ",\"failed\":true");
  for (auto& p : paths) ::unlink(p.c_str());
  cuMemFree(d);
}

void bench_gpu(const options& o) {
  check(cuInit(0), "cuInit");
  CUdevice dev;
  check(cuDeviceGet(&dev, 0), "cuDeviceGet");
  CUcontext ctx;
  check(cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
  check(cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
  char name[256] = {};
  cuDeviceGetName(name, sizeof name, dev);

  // Pinning: what a staging buffer costs to set up, by the two ways there are.
  if (o.wants("pin")) {
    const std::uint64_t pin = std::min<std::uint64_t>(o.bytes, 1ull << 30);
    void* host = nullptr;
    auto t0 = clock_type::now();
    check(cuMemHostAlloc(&host, pin, 0), "cuMemHostAlloc");
    emit("pinned_alloc", pin, 1, seconds_since(t0));
    t0 = clock_type::now();
    check(cuMemFreeHost(host), "cuMemFreeHost");
    emit("pinned_free", pin, 1, seconds_since(t0));

    void* anon = ::mmap(nullptr, pin, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (anon == MAP_FAILED) die("mmap");
    std::memset(anon, 1, pin);
    t0 = clock_type::now();
    check(cuMemHostRegister(anon, pin, 0), "cuMemHostRegister");
    emit("register_touched", pin, 1, seconds_since(t0));
    check(cuMemHostUnregister(anon), "cuMemHostUnregister");
    ::munmap(anon, pin);

    // Registering the pages of a file in DIR itself: copies could then land in the image directly.
    const std::string path = o.dir + "/vmmckpt-limits-register-" + std::to_string(::getpid());
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd >= 0 && ::ftruncate(fd, static_cast<off_t>(pin)) == 0) {
      void* map = ::mmap(nullptr, pin, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (map != MAP_FAILED) {
        t0 = clock_type::now();
        std::memset(map, 1, pin);
        emit("file_map_touch", pin, 1, seconds_since(t0));
        t0 = clock_type::now();
        const CUresult r = cuMemHostRegister(map, pin, 0);
        emit("register_file_map", pin, 1, seconds_since(t0), r == CUDA_SUCCESS ? "" : ",\"failed\":true");
        if (r == CUDA_SUCCESS) cuMemHostUnregister(map);
        ::munmap(map, pin);
      }
    }
    if (fd >= 0) ::close(fd);
    ::unlink(path.c_str());
  }

  // Physical memory: what backing an allocation with a VMM handle costs (create, map, access),
  // and a plain cuMemAlloc, which restore, resume and the dump's GPU snapshot pay per byte.
  if (o.wants("vmm")) {
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    for (std::uint64_t size : {64ull << 20, 1ull << 30, 8ull << 30}) {
      CUdeviceptr va = 0;
      check(cuMemAddressReserve(&va, size, 0, 0, 0), "cuMemAddressReserve");
      auto t0 = clock_type::now();
      CUmemGenericAllocationHandle h = 0;
      check(cuMemCreate(&h, size, &prop, 0), "cuMemCreate");
      const double create = seconds_since(t0);
      check(cuMemMap(va, size, 0, h, 0), "cuMemMap");
      CUmemAccessDesc access{};
      access.location = prop.location;
      access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
      check(cuMemSetAccess(va, size, &access, 1), "cuMemSetAccess");
      emit("vmm_create_map", size, 1, seconds_since(t0), ",\"create_seconds\":" + std::to_string(create));
      t0 = clock_type::now();
      check(cuMemUnmap(va, size), "cuMemUnmap");
      check(cuMemRelease(h), "cuMemRelease");
      emit("vmm_unmap_release", size, 1, seconds_since(t0));
      cuMemAddressFree(va, size);
    }
    CUdeviceptr big = 0;
    auto t0 = clock_type::now();
    if (cuMemAlloc(&big, o.bytes) == CUDA_SUCCESS) {
      emit("cu_mem_alloc", o.bytes, 1, seconds_since(t0));
      cuMemFree(big);
    }
  }

  if (o.wants("direct")) bench_direct(o);
  if (!o.wants("pcie") && !o.wants("d2d")) return;
  CUdeviceptr d = 0;
  check(cuMemAlloc(&d, o.bytes), "cuMemAlloc");
  check(cuMemsetD8(d, 7, o.bytes), "cuMemsetD8");
  void* host = nullptr;
  check(cuMemHostAlloc(&host, o.bytes, 0), "cuMemHostAlloc");
  std::memset(host, 3, o.bytes);
  check(cuCtxSynchronize(), "cuCtxSynchronize");

  // The PCIe limit, as a dump sees it: pinned copies of the whole size, one stream and four.
  if (o.wants("pcie")) {
    for (int streams : {1, 4}) {
      std::vector<CUstream> ss(streams);
      for (auto& s : ss) check(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
      const std::uint64_t piece = o.bytes / streams;
      for (int dir = 0; dir < 2; ++dir) {
        for (int rep = 0; rep < 2; ++rep) {  // the first of each is a warm-up, not reported
          const auto t0 = clock_type::now();
          for (int k = 0; k < streams; ++k) {
            char* h = static_cast<char*>(host) + k * piece;
            if (dir == 0)
              check(cuMemcpyDtoHAsync(h, d + k * piece, piece, ss[k]), "cuMemcpyDtoHAsync");
            else
              check(cuMemcpyHtoDAsync(d + k * piece, h, piece, ss[k]), "cuMemcpyHtoDAsync");
          }
          for (auto s : ss) check(cuStreamSynchronize(s), "cuStreamSynchronize");
          const double s = seconds_since(t0);
          if (rep == 1) emit(dir == 0 ? "pcie_dtoh" : "pcie_htod", piece * streams, streams, s);
        }
      }
      for (auto s : ss) cuStreamDestroy(s);
    }
  }
  if (o.wants("d2d")) {
    CUdeviceptr d2 = 0;
    if (cuMemAlloc(&d2, o.bytes) == CUDA_SUCCESS) {
      for (int rep = 0; rep < 2; ++rep) {
        const auto t0 = clock_type::now();
        check(cuMemcpyDtoD(d2, d, o.bytes), "cuMemcpyDtoD");
        check(cuCtxSynchronize(), "cuCtxSynchronize");
        if (rep == 1) emit("d2d", o.bytes, 1, seconds_since(t0));
      }
      cuMemFree(d2);
    }
  }
  cuMemFreeHost(host);
  cuMemFree(d);
}

std::vector<int> parse_list(const std::string& s) {
  std::vector<int> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) out.push_back(std::max(1, std::atoi(item.c_str())));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) die(a + " needs a value");
      return argv[++i];
    };
    if (a == "--dir")
      o.dir = value();
    else if (a == "--bytes")
      o.bytes = std::strtoull(value().c_str(), nullptr, 0);
    else if (a == "--threads")
      o.threads = parse_list(value());
    else if (a == "--no-gpu")
      o.gpu = false;
    else if (a == "--only") {
      std::stringstream in(value());
      for (std::string item; std::getline(in, item, ',');) o.only.insert(item);
    } else
      die("unknown option " + a + " (see the comment at the top of bench/host_limits.cpp)");
  }
  if (o.bytes < io_piece * 16) die("--bytes must be at least 512 MiB");

  if (o.wants("memcpy") || o.wants("write_files") || o.wants("write_one_file")) {
    std::vector<char> src(o.bytes), dst;
    std::memset(src.data(), 0x5a, src.size());
    if (o.wants("memcpy")) {
      dst.resize(o.bytes);
      std::memset(dst.data(), 0, dst.size());
      bench_memcpy(o, src.data(), dst.data());
      dst = {};
    }
    if (o.wants("write_files")) bench_file_write(o, src.data(), false);
    if (o.wants("write_one_file")) bench_file_write(o, src.data(), true);
  }
  if (o.gpu) bench_gpu(o);
  return 0;
}
