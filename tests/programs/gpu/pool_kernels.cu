// GPU test program: allocates through every runtime and driver door (cudaMalloc, cudaMallocPitch,
// cudaMallocAsync, cuMemAlloc via the entry-point resolver), runs deterministic kernels over the
// buffers, and prints ptr/result lines that check_pool_run.py compares native vs shim.
#include "gpu_check.cuh"

#include <dlfcn.h>

#include <cstring>
#include <string>
#include <vector>

namespace {

constexpr size_t kib = 1024;
constexpr size_t mib = 1024 * kib;

using gpu_check::mix32;

__host__ __device__ inline uint32_t fill_value(size_t i, uint32_t seed) {
  return mix32(static_cast<uint32_t>(i) ^ (seed * 0x9e3779b9U) ^ static_cast<uint32_t>(i >> 32));
}

__host__ __device__ inline uint32_t transform_value(uint32_t v, uint32_t mul, uint32_t add) {
  return (v * mul + add) ^ (v >> 7);
}

__global__ void fill_kernel(uint32_t* buf, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x)
    buf[i] = fill_value(i, seed);
}

__global__ void transform_kernel(const uint32_t* in, uint32_t* out, size_t n, uint32_t mul, uint32_t add) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x)
    out[i] = transform_value(in[i], mul, add);
}

// Sums mod 2^64 are order independent, so atomics still give a reproducible checksum.
// acc[0]: plain sum, acc[1]: position-weighted sum (catches swapped or shifted data).
__global__ void checksum_kernel(const uint32_t* buf, size_t n, unsigned long long* acc) {
  unsigned long long plain = 0, weighted = 0;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    plain += buf[i];
    weighted += static_cast<unsigned long long>(buf[i]) * (i + 1);
  }
  atomicAdd(&acc[0], plain);
  atomicAdd(&acc[1], weighted);
}

__global__ void fill_pitched_kernel(uint8_t* base, size_t pitch, size_t width_words, size_t height, uint32_t seed) {
  size_t row = blockIdx.y;
  auto* row_ptr = reinterpret_cast<uint32_t*>(base + row * pitch);
  for (size_t col = threadIdx.x; col < width_words; col += blockDim.x)
    row_ptr[col] = fill_value(row * width_words + col, seed);
  (void)height;
}

// Follows device pointers stored in device memory: pool addresses must work inside kernels.
__global__ void chase_kernel(uint32_t* const* table, size_t count, unsigned long long* out) {
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    unsigned long long s = 0;
    for (size_t i = 0; i < count; ++i) s = s * 1000003ULL + table[i][0] + table[i][1];
    *out = s;
  }
}

// Keeps writing to buf for a while: used to see whether freed memory is reused while work that
// was submitted before the free is still running (native cudaFree waits for it).
__global__ void slow_writer_kernel(uint32_t* buf, size_t n, uint32_t value, int rounds) {
  for (int r = 0; r < rounds; ++r) {
    for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x)
      buf[i] = value;
    __nanosleep(2000);
  }
}

constexpr int grid = 264;  // a couple of waves on H100/H200; the size does not change results
constexpr int block = 256;

struct checksums {
  uint64_t plain = 0;
  uint64_t weighted = 0;
  bool operator==(const checksums&) const = default;
};

checksums host_checksum(const uint32_t* data, size_t n) {
  checksums c;
  for (size_t i = 0; i < n; ++i) {
    c.plain += data[i];
    c.weighted += static_cast<uint64_t>(data[i]) * (i + 1);
  }
  return c;
}

checksums device_checksum(const uint32_t* buf, size_t n, unsigned long long* acc, cudaStream_t stream) {
  VMMCKPT_CHECK(cudaMemsetAsync(acc, 0, 2 * sizeof(unsigned long long), stream));
  checksum_kernel<<<grid, block, 0, stream>>>(buf, n, acc);
  GPU_CHECK_LAUNCH();
  unsigned long long host[2];
  VMMCKPT_CHECK(cudaMemcpyAsync(host, acc, sizeof(host), cudaMemcpyDeviceToHost, stream));
  VMMCKPT_CHECK(cudaStreamSynchronize(stream));
  return {host[0], host[1]};
}

int failures = 0;

void expect(bool ok, const std::string& what) {
  if (!ok) {
    std::fprintf(stderr, "CHECK FAILED: %s\n", what.c_str());
    ++failures;
  }
}

void report(const std::string& name, const checksums& c) {
  gpu_check::print_result((name + ".sum").c_str(), c.plain);
  gpu_check::print_result((name + ".wsum").c_str(), c.weighted);
}

// Copies a buffer back, checks device checksum == host checksum of the copy == expectation
// computed from the formula, and prints the checksum.
void verify_buffer(const std::string& name, const uint32_t* dev, size_t n, const std::vector<uint32_t>& expected,
                   unsigned long long* acc, cudaStream_t stream) {
  std::vector<uint32_t> host(n);
  VMMCKPT_CHECK(cudaMemcpyAsync(host.data(), dev, n * sizeof(uint32_t), cudaMemcpyDeviceToHost, stream));
  VMMCKPT_CHECK(cudaStreamSynchronize(stream));
  checksums from_device = device_checksum(dev, n, acc, stream);
  checksums from_copy = host_checksum(host.data(), n);
  checksums from_formula = host_checksum(expected.data(), n);
  expect(from_device == from_copy, name + ": device checksum differs from the copied bytes");
  expect(from_copy == from_formula, name + ": copied bytes differ from the expected values");
  report(name, from_copy);
}

std::vector<uint32_t> expected_fill(size_t n, uint32_t seed) {
  std::vector<uint32_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = fill_value(i, seed);
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  const int device = gpu_check::device_option(argc, argv);
  VMMCKPT_CHECK(cudaSetDevice(device));
  VMMCKPT_CHECK(cudaFree(nullptr));  // create the primary context before timing-free work starts

  cudaStream_t stream;
  VMMCKPT_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  unsigned long long* acc = nullptr;
  VMMCKPT_CHECK(cudaMalloc(&acc, 2 * sizeof(unsigned long long)));
  gpu_check::print_ptr(acc, 2 * sizeof(unsigned long long), "cudaMalloc");

  // 1. cudaMalloc over a spread of sizes, odd ones included (1 KiB .. 256 MiB, ~340 MiB total).
  const size_t sizes[] = {1 * kib,  4 * kib + 12, 64 * kib,  1 * mib, 3 * mib + 4,
                          16 * mib, 64 * mib,     256 * mib, 2 * mib};
  std::vector<uint32_t*> bufs;
  std::vector<size_t> words;
  for (size_t idx = 0; idx < std::size(sizes); ++idx) {
    uint32_t* p = nullptr;
    VMMCKPT_CHECK(cudaMalloc(&p, sizes[idx]));
    gpu_check::print_ptr(p, sizes[idx], "cudaMalloc");
    expect(reinterpret_cast<uintptr_t>(p) % 256 == 0, "cudaMalloc pointer not 256-byte aligned");
    bufs.push_back(p);
    words.push_back(sizes[idx] / sizeof(uint32_t));
  }
  for (size_t idx = 0; idx < bufs.size(); ++idx) {
    fill_kernel<<<grid, block, 0, stream>>>(bufs[idx], words[idx], static_cast<uint32_t>(idx + 1));
    GPU_CHECK_LAUNCH();
  }
  for (size_t idx = 0; idx < bufs.size(); ++idx)
    verify_buffer("malloc" + std::to_string(idx), bufs[idx], words[idx],
                  expected_fill(words[idx], static_cast<uint32_t>(idx + 1)), acc, stream);

  // Transform the 64 MiB buffer into the 256 MiB one (first quarter) and check the result.
  {
    size_t n = words[6];
    transform_kernel<<<grid, block, 0, stream>>>(bufs[6], bufs[7], n, 2654435761U, 12345U);
    GPU_CHECK_LAUNCH();
    std::vector<uint32_t> expected = expected_fill(words[7], 8);
    std::vector<uint32_t> src = expected_fill(n, 7);
    for (size_t i = 0; i < n; ++i) expected[i] = transform_value(src[i], 2654435761U, 12345U);
    verify_buffer("transform", bufs[7], words[7], expected, acc, stream);
  }

  // Copies between pool buffers with cudaMemcpyDefault: needs UVA to know the pool addresses.
  {
    VMMCKPT_CHECK(cudaMemsetAsync(bufs[5], 0x5a, sizes[5], stream));
    VMMCKPT_CHECK(cudaMemcpyAsync(bufs[5], bufs[3], sizes[3], cudaMemcpyDefault, stream));
    std::vector<uint32_t> expected(words[5], 0x5a5a5a5aU);
    std::vector<uint32_t> src = expected_fill(words[3], 4);
    std::copy(src.begin(), src.end(), expected.begin());
    verify_buffer("memset_copy", bufs[5], words[5], expected, acc, stream);
  }

  // 2. cudaMallocPitch and 2D copies.
  {
    const size_t width_words = 250, height = 300;  // 1000 bytes wide: pitch > width
    void* p = nullptr;
    size_t pitch = 0;
    VMMCKPT_CHECK(cudaMallocPitch(&p, &pitch, width_words * sizeof(uint32_t), height));
    gpu_check::print_ptr(p, pitch * height, "cudaMallocPitch");
    expect(pitch >= width_words * sizeof(uint32_t), "pitch smaller than the row width");
    fill_pitched_kernel<<<dim3(1, height), block, 0, stream>>>(static_cast<uint8_t*>(p), pitch, width_words, height,
                                                               99);
    GPU_CHECK_LAUNCH();
    std::vector<uint32_t> host(width_words * height);
    VMMCKPT_CHECK(cudaMemcpy2DAsync(host.data(), width_words * sizeof(uint32_t), p, pitch,
                                    width_words * sizeof(uint32_t), height, cudaMemcpyDeviceToHost, stream));
    VMMCKPT_CHECK(cudaStreamSynchronize(stream));
    std::vector<uint32_t> expected = expected_fill(width_words * height, 99);
    expect(host == expected, "pitched buffer content differs");
    report("pitched", host_checksum(host.data(), host.size()));
    VMMCKPT_CHECK(cudaFree(p));
  }

  // 3. Stream-ordered allocations, with a free and a reallocation in the middle of the stream.
  {
    const size_t async_sizes[] = {1 * mib, 5 * mib + 8, 33 * mib};
    uint32_t* a[3];
    for (int i = 0; i < 3; ++i) {
      VMMCKPT_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&a[i]), async_sizes[i], stream));
      gpu_check::print_ptr(a[i], async_sizes[i], "cudaMallocAsync");
      fill_kernel<<<grid, block, 0, stream>>>(a[i], async_sizes[i] / 4, 200 + i);
      GPU_CHECK_LAUNCH();
    }
    VMMCKPT_CHECK(cudaFreeAsync(a[0], stream));
    uint32_t* b = nullptr;
    const size_t b_size = 12 * mib;
    VMMCKPT_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&b), b_size, stream));
    gpu_check::print_ptr(b, b_size, "cudaMallocAsync");
    VMMCKPT_CHECK(cudaMemsetAsync(b, 0, b_size, stream));
    size_t n = async_sizes[1] / 4;
    transform_kernel<<<grid, block, 0, stream>>>(a[1], b, n, 747796405U, 2891336453U);
    GPU_CHECK_LAUNCH();
    std::vector<uint32_t> expected(b_size / 4, 0);
    std::vector<uint32_t> src = expected_fill(n, 201);
    for (size_t i = 0; i < n; ++i) expected[i] = transform_value(src[i], 747796405U, 2891336453U);
    verify_buffer("async_transform", b, b_size / 4, expected, acc, stream);
    verify_buffer("async2", a[2], async_sizes[2] / 4, expected_fill(async_sizes[2] / 4, 202), acc, stream);
    VMMCKPT_CHECK(cudaFreeAsync(a[1], stream));
    VMMCKPT_CHECK(cudaFreeAsync(a[2], stream));
    VMMCKPT_CHECK(cudaFreeAsync(b, stream));
    VMMCKPT_CHECK(cudaStreamSynchronize(stream));
  }

  // 4. The driver API reached through each resolver door: cudart's entry-point query (what
  // NCCL and PyTorch use), the driver's own cuGetProcAddress, and dlopen/dlsym of libcuda.
  {
    using mem_alloc_fn = CUresult (*)(CUdeviceptr*, size_t);
    using mem_free_fn = CUresult (*)(CUdeviceptr);
    using get_proc_fn = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
    struct door {
      const char* api;
      mem_alloc_fn alloc;
      mem_free_fn free;
    };
    std::vector<door> doors;
    doors.push_back({"cuMemAlloc", reinterpret_cast<mem_alloc_fn>(gpu_check::driver_entry_point("cuMemAlloc")),
                     reinterpret_cast<mem_free_fn>(gpu_check::driver_entry_point("cuMemFree"))});
    // RTLD_NOLOAD: cudart has loaded libcuda already; we only want a handle to it.
    void* libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (libcuda == nullptr) {
      std::fprintf(stderr, "error: dlopen(libcuda.so.1, RTLD_NOLOAD) failed: %s\n", dlerror());
      return 1;
    }
    auto sym = [&](const char* name) {
      void* fn = dlsym(libcuda, name);
      if (fn == nullptr) {
        std::fprintf(stderr, "error: dlsym(libcuda, %s) failed: %s\n", name, dlerror());
        std::exit(1);
      }
      return fn;
    };
    auto get_proc = reinterpret_cast<get_proc_fn>(sym("cuGetProcAddress_v2"));
    void* alloc_fn = nullptr;
    void* free_fn = nullptr;
    CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    VMMCKPT_CHECK(get_proc("cuMemAlloc", &alloc_fn, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &found));
    expect(found == CU_GET_PROC_ADDRESS_SUCCESS && alloc_fn != nullptr, "cuGetProcAddress(cuMemAlloc)");
    VMMCKPT_CHECK(get_proc("cuMemFree", &free_fn, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &found));
    expect(found == CU_GET_PROC_ADDRESS_SUCCESS && free_fn != nullptr, "cuGetProcAddress(cuMemFree)");
    doors.push_back({"cuGetProcAddress:cuMemAlloc", reinterpret_cast<mem_alloc_fn>(alloc_fn),
                     reinterpret_cast<mem_free_fn>(free_fn)});
    doors.push_back({"dlsym:cuMemAlloc_v2", reinterpret_cast<mem_alloc_fn>(sym("cuMemAlloc_v2")),
                     reinterpret_cast<mem_free_fn>(sym("cuMemFree_v2"))});

    for (size_t i = 0; i < doors.size(); ++i) {
      CUdeviceptr d = 0;
      const size_t d_size = 8 * mib + 12 + i * 4096;
      const uint32_t seed = 300 + static_cast<uint32_t>(i);
      VMMCKPT_CHECK(doors[i].alloc(&d, d_size));
      gpu_check::print_ptr(d, d_size, doors[i].api);
      auto* p = reinterpret_cast<uint32_t*>(d);
      fill_kernel<<<grid, block, 0, stream>>>(p, d_size / 4, seed);
      GPU_CHECK_LAUNCH();
      verify_buffer("driver" + std::to_string(i), p, d_size / 4, expected_fill(d_size / 4, seed), acc, stream);
      VMMCKPT_CHECK(doors[i].free(d));
    }
    dlclose(libcuda);
  }

  // 5. A pointer table in device memory that kernels follow into the other allocations.
  {
    uint32_t** table = nullptr;
    VMMCKPT_CHECK(cudaMalloc(&table, bufs.size() * sizeof(uint32_t*)));
    gpu_check::print_ptr(table, bufs.size() * sizeof(uint32_t*), "cudaMalloc");
    VMMCKPT_CHECK(cudaMemcpyAsync(table, bufs.data(), bufs.size() * sizeof(uint32_t*), cudaMemcpyHostToDevice, stream));
    chase_kernel<<<1, 32, 0, stream>>>(table, bufs.size(), acc);
    GPU_CHECK_LAUNCH();
    unsigned long long chased = 0;
    VMMCKPT_CHECK(cudaMemcpyAsync(&chased, acc, sizeof(chased), cudaMemcpyDeviceToHost, stream));
    VMMCKPT_CHECK(cudaStreamSynchronize(stream));
    // The same walk on the host over the values each buffer holds by now.
    unsigned long long expected = 0;
    for (size_t i = 0; i < bufs.size(); ++i) {
      uint32_t head[2];
      VMMCKPT_CHECK(cudaMemcpy(head, bufs[i], sizeof(head), cudaMemcpyDeviceToHost));
      expected = expected * 1000003ULL + head[0] + head[1];
    }
    expect(chased == expected, "pointer chase through device-stored addresses differs");
    gpu_check::print_result("pointer_chase", chased);
    VMMCKPT_CHECK(cudaFree(table));
  }

  // 6. Churn: free and reallocate many sizes; every new buffer must hold exactly what we wrote.
  {
    VMMCKPT_CHECK(cudaFree(bufs[5]));
    VMMCKPT_CHECK(cudaFree(bufs[3]));
    uint64_t churn_sum = 0;
    for (int round = 0; round < 48; ++round) {
      size_t size = (4 * kib) << (round % 11);  // 4 KiB .. 4 MiB
      size += static_cast<size_t>(round) * 256;
      uint32_t* p = nullptr;
      VMMCKPT_CHECK(cudaMalloc(&p, size));
      gpu_check::print_ptr(p, size, "cudaMalloc");
      fill_kernel<<<grid, block, 0, stream>>>(p, size / 4, 400 + round);
      GPU_CHECK_LAUNCH();
      checksums c = device_checksum(p, size / 4, acc, stream);
      std::vector<uint32_t> expected = expected_fill(size / 4, 400 + round);
      expect(c == host_checksum(expected.data(), expected.size()),
             "churn round " + std::to_string(round) + " checksum differs");
      churn_sum = churn_sum * 31 + c.weighted;
      VMMCKPT_CHECK(cudaFree(p));
    }
    gpu_check::print_result("churn", churn_sum);
  }

  // 7. Free while a kernel still writes, then reuse on another stream: native cudaFree waits for
  // the kernel, so the new buffer must end up holding only what we put there.
  {
    const size_t size = 4 * mib;
    cudaStream_t other;
    VMMCKPT_CHECK(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
    uint32_t* victim = nullptr;
    VMMCKPT_CHECK(cudaMalloc(&victim, size));
    gpu_check::print_ptr(victim, size, "cudaMalloc");
    slow_writer_kernel<<<64, block, 0, stream>>>(victim, size / 4, 0xdeadbeefU, 4000);
    GPU_CHECK_LAUNCH();
    VMMCKPT_CHECK(cudaFree(victim));
    uint32_t* fresh = nullptr;
    VMMCKPT_CHECK(cudaMalloc(&fresh, size));
    gpu_check::print_ptr(fresh, size, "cudaMalloc");
    VMMCKPT_CHECK(cudaMemsetAsync(fresh, 0, size, other));
    std::vector<uint32_t> host(size / 4, 1);
    VMMCKPT_CHECK(cudaMemcpyAsync(host.data(), fresh, size, cudaMemcpyDeviceToHost, other));
    VMMCKPT_CHECK(cudaStreamSynchronize(other));
    VMMCKPT_CHECK(cudaDeviceSynchronize());
    // Copy again after everything has finished: a late write from the old kernel shows here.
    VMMCKPT_CHECK(cudaMemcpy(host.data(), fresh, size, cudaMemcpyDeviceToHost));
    size_t dirty = 0;
    for (uint32_t v : host) dirty += (v != 0);
    expect(dirty == 0, "memory reused while a kernel submitted before cudaFree still wrote it (" +
                           std::to_string(dirty) + " dirty words)");
    gpu_check::print_result("free_reuse_dirty_words", dirty);
    VMMCKPT_CHECK(cudaFree(fresh));
    VMMCKPT_CHECK(cudaStreamDestroy(other));
  }

  for (size_t idx = 0; idx < bufs.size(); ++idx)
    if (idx != 3 && idx != 5) VMMCKPT_CHECK(cudaFree(bufs[idx]));
  VMMCKPT_CHECK(cudaFree(acc));
  VMMCKPT_CHECK(cudaStreamDestroy(stream));
  VMMCKPT_CHECK(cudaDeviceSynchronize());

  if (failures != 0) {
    std::fprintf(stderr, "pool_kernels: %d check(s) failed\n", failures);
    return 1;
  }
  std::printf("info pool_kernels done\n");
  return 0;
}
