// GPU test program: prints the exact return codes (and address-free values) native CUDA gives for
// allocation edge cases of the runtime and driver APIs, one "case" line each, so that
// check_pool_run.py can demand the shim returns the same.
#include "gpu_check.cuh"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace {

constexpr size_t mib = 1024 * 1024;
constexpr size_t pib = size_t{1} << 50;

std::string code(cudaError_t s) {
  char buf[128];
  gpu_check::format_code(buf, sizeof(buf), s);
  return buf;
}

std::string code(CUresult s) {
  char buf[128];
  gpu_check::format_code(buf, sizeof(buf), s);
  return buf;
}

template <typename Status>
void print_case(const std::string& name, Status status, const std::string& values = "") {
  std::printf("case %s %s%s%s\n", name.c_str(), code(status).c_str(), values.empty() ? "" : " ", values.c_str());
}

// The runtime also records errors for cudaGetLastError; programs rely on that state being right
// (a stale error there breaks the next error check), so every runtime case prints it as well.
void print_last_error(const std::string& name) { print_case(name + ".last_error", cudaGetLastError()); }

std::string kv(const char* key, long long value) { return std::string(key) + "=" + std::to_string(value); }

long long offset(const void* p, const void* base) {
  return static_cast<long long>(reinterpret_cast<uintptr_t>(p) - reinterpret_cast<uintptr_t>(base));
}

void* sentinel() { return reinterpret_cast<void*>(uintptr_t{0x1234}); }

void runtime_cases(cudaStream_t stream) {
  {
    void* p = sentinel();
    cudaError_t s = cudaMalloc(&p, 0);
    print_case("cudaMalloc_size0", s, kv("ptr_null", p == nullptr));
    print_last_error("cudaMalloc_size0");
    if (s == cudaSuccess && p != nullptr && p != sentinel()) VMMCKPT_CHECK(cudaFree(p));
  }
  {
    print_case("cudaMalloc_null_out", cudaMalloc(nullptr, 1024));
    print_last_error("cudaMalloc_null_out");
  }
  {
    print_case("cudaFree_null", cudaFree(nullptr));
    print_last_error("cudaFree_null");
  }
  {
    void* p = nullptr;
    VMMCKPT_CHECK(cudaMalloc(&p, mib));
    gpu_check::print_ptr(p, mib, "cudaMalloc");
    print_case("cudaFree_double.first", cudaFree(p));
    print_case("cudaFree_double.second", cudaFree(p));
    print_last_error("cudaFree_double");
  }
  {
    void* p = nullptr;
    VMMCKPT_CHECK(cudaMalloc(&p, mib));
    gpu_check::print_ptr(p, mib, "cudaMalloc");
    print_case("cudaFree_interior", cudaFree(static_cast<char*>(p) + 4096));
    print_last_error("cudaFree_interior");
    // The interior free must not have released the allocation.
    print_case("cudaFree_interior.base_after", cudaFree(p));
  }
  {
    void* host = std::malloc(4096);
    print_case("cudaFree_host", cudaFree(host));
    print_last_error("cudaFree_host");
    std::free(host);
  }
  // Pitches: the value itself is the runtime's choice (informational); that it fits is not.
  int tex_pitch_align = 0;
  VMMCKPT_CHECK(cudaDeviceGetAttribute(&tex_pitch_align, cudaDevAttrTexturePitchAlignment, 0));
  std::printf("info texture_pitch_alignment %d\n", tex_pitch_align);
  for (size_t width : {size_t{1}, size_t{100}, size_t{512}, size_t{513}, size_t{1000}, size_t{4096}, size_t{70000}}) {
    void* p = nullptr;
    size_t pitch = 0;
    const size_t height = 10;
    cudaError_t s = cudaMallocPitch(&p, &pitch, width, height);
    std::string name = "cudaMallocPitch_w" + std::to_string(width);
    print_case(
        name, s,
        kv("pitch_ge_width", pitch >= width) + " " + kv("aligned256", reinterpret_cast<uintptr_t>(p) % 256 == 0));
    std::printf("info %s pitch %zu pitch_mod_texalign %zu\n", name.c_str(), pitch,
                tex_pitch_align > 0 ? pitch % static_cast<size_t>(tex_pitch_align) : 0);
    if (s == cudaSuccess) {
      gpu_check::print_ptr(p, pitch * height, "cudaMallocPitch");
      // Touch the last byte of the last row: the whole pitched block must be backed.
      VMMCKPT_CHECK(cudaMemset(static_cast<char*>(p) + pitch * (height - 1), 0x7f, pitch));
      VMMCKPT_CHECK(cudaFree(p));
    }
  }
  {
    void* p = sentinel();
    size_t pitch = 12345;
    cudaError_t s = cudaMallocPitch(&p, &pitch, 0, 10);
    print_case("cudaMallocPitch_width0", s, kv("ptr_null", p == nullptr));
    print_last_error("cudaMallocPitch_width0");
    if (s == cudaSuccess && p != nullptr && p != sentinel()) VMMCKPT_CHECK(cudaFree(p));
  }
  {
    void* p = sentinel();
    cudaError_t s = cudaMalloc(&p, pib);
    print_case("cudaMalloc_1PiB", s);
    print_case("cudaMalloc_1PiB.last_error", cudaGetLastError());
    print_case("cudaMalloc_1PiB.last_error_again", cudaGetLastError());
    if (s == cudaSuccess) VMMCKPT_CHECK(cudaFree(p));
    // Out of memory is not sticky: the next allocation works.
    void* q = nullptr;
    cudaError_t s2 = cudaMalloc(&q, mib);
    print_case("cudaMalloc_after_oom", s2);
    if (s2 == cudaSuccess) {
      gpu_check::print_ptr(q, mib, "cudaMalloc");
      VMMCKPT_CHECK(cudaFree(q));
    }
  }
  {
    size_t free_before = 0, total = 0;
    cudaError_t s = cudaMemGetInfo(&free_before, &total);
    cudaDeviceProp prop{};
    VMMCKPT_CHECK(cudaGetDeviceProperties(&prop, 0));
    print_case("cudaMemGetInfo", s,
               kv("free_le_total", free_before <= total) + " " + kv("total_eq_prop", total == prop.totalGlobalMem) +
                   " " + kv("free_positive", free_before > 0));
    void* p = nullptr;
    VMMCKPT_CHECK(cudaMalloc(&p, 256 * mib));
    gpu_check::print_ptr(p, 256 * mib, "cudaMalloc");
    VMMCKPT_CHECK(cudaMemset(p, 0, 256 * mib));
    size_t free_after = 0, total_after = 0;
    VMMCKPT_CHECK(cudaMemGetInfo(&free_after, &total_after));
    // How a pool accounts for memory is its own business: the drop is informational.
    std::printf("info cudaMemGetInfo free %zu total %zu drop_after_256MiB %lld\n", free_before, total,
                static_cast<long long>(free_before) - static_cast<long long>(free_after));
    VMMCKPT_CHECK(cudaFree(p));
  }
  {
    void* p = sentinel();
    cudaError_t s = cudaMallocAsync(&p, 0, stream);
    print_case("cudaMallocAsync_size0", s, kv("ptr_null", p == nullptr));
    print_last_error("cudaMallocAsync_size0");
    print_case("cudaFreeAsync_null", cudaFreeAsync(nullptr, stream));
    print_last_error("cudaFreeAsync_null");
    VMMCKPT_CHECK(cudaStreamSynchronize(stream));
  }
  {
    // Many odd sizes: all 256-byte aligned and pairwise disjoint.
    std::vector<std::pair<uintptr_t, size_t>> ranges;
    bool aligned = true;
    for (size_t i = 0; i < 64; ++i) {
      size_t size = 1 + i * 157 + (i % 7) * 4099;
      void* p = nullptr;
      VMMCKPT_CHECK(cudaMalloc(&p, size));
      gpu_check::print_ptr(p, size, "cudaMalloc");
      aligned = aligned && reinterpret_cast<uintptr_t>(p) % 256 == 0;
      ranges.emplace_back(reinterpret_cast<uintptr_t>(p), size);
    }
    std::sort(ranges.begin(), ranges.end());
    bool disjoint = true;
    for (size_t i = 1; i < ranges.size(); ++i)
      disjoint = disjoint && ranges[i - 1].first + ranges[i - 1].second <= ranges[i].first;
    print_case("cudaMalloc_small_many", cudaSuccess, kv("aligned256", aligned) + " " + kv("disjoint", disjoint));
    for (auto& r : ranges) VMMCKPT_CHECK(cudaFree(reinterpret_cast<void*>(r.first)));
  }
  {
    // What PyTorch and others ask about a pointer they were given.
    char* p = nullptr;
    VMMCKPT_CHECK(cudaMalloc(&p, 2 * mib));
    gpu_check::print_ptr(p, 2 * mib, "cudaMalloc");
    cudaPointerAttributes attr{};
    cudaError_t s = cudaPointerGetAttributes(&attr, p + 1000);
    print_case("cudaPointerGetAttributes_device", s,
               kv("type", attr.type) + " " + kv("device", attr.device) + " " +
                   kv("dev_off", offset(attr.devicePointer, p)) + " " + kv("host_null", attr.hostPointer == nullptr));
    print_last_error("cudaPointerGetAttributes_device");
    std::vector<char> host(4096);
    cudaPointerAttributes host_attr{};
    s = cudaPointerGetAttributes(&host_attr, host.data());
    print_case("cudaPointerGetAttributes_host", s, kv("type", host_attr.type));
    print_last_error("cudaPointerGetAttributes_host");
    // cudaMemcpyDefault finds the direction through UVA.
    for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<char>(i * 7);
    std::vector<char> back(host.size(), 0);
    cudaError_t s1 = cudaMemcpy(p + 8192, host.data(), host.size(), cudaMemcpyDefault);
    cudaError_t s2 = cudaMemcpy(back.data(), p + 8192, back.size(), cudaMemcpyDefault);
    print_case("cudaMemcpyDefault_roundtrip", s1 != cudaSuccess ? s1 : s2, kv("match", host == back));
    // Legacy IPC: natively every cudaMalloc allocation can be exported this way (PyTorch's
    // multiprocessing tensor sharing uses it).
    cudaIpcMemHandle_t handle{};
    print_case("cudaIpcGetMemHandle", cudaIpcGetMemHandle(&handle, p));
    print_last_error("cudaIpcGetMemHandle");
    VMMCKPT_CHECK(cudaFree(p));
  }
}

void driver_cases() {
  {
    CUdeviceptr d = 0x1234;
    print_case("cuMemAlloc_size0", cuMemAlloc_v2(&d, 0));
  }
  print_case("cuMemAlloc_null_out", cuMemAlloc_v2(nullptr, 1024));
  print_case("cuMemFree_zero", cuMemFree_v2(0));
  {
    CUdeviceptr d = 0;
    VMMCKPT_CHECK(cuMemAlloc_v2(&d, mib));
    gpu_check::print_ptr(d, mib, "cuMemAlloc");
    print_case("cuMemFree_double.first", cuMemFree_v2(d));
    print_case("cuMemFree_double.second", cuMemFree_v2(d));
  }
  {
    CUdeviceptr d = 0;
    VMMCKPT_CHECK(cuMemAlloc_v2(&d, mib));
    gpu_check::print_ptr(d, mib, "cuMemAlloc");
    print_case("cuMemFree_interior", cuMemFree_v2(d + 4096));
    print_case("cuMemFree_interior.base_after", cuMemFree_v2(d));
  }
  {
    int local = 0;
    print_case("cuMemFree_host", cuMemFree_v2(reinterpret_cast<CUdeviceptr>(&local)));
  }
  for (size_t size : {6 * mib, size_t{1000000}}) {
    CUdeviceptr d = 0;
    VMMCKPT_CHECK(cuMemAlloc_v2(&d, size));
    gpu_check::print_ptr(d, size, "cuMemAlloc");
    std::string name = "cuMemGetAddressRange_interior_" + std::to_string(size);
    CUdeviceptr base = 0;
    size_t range = 0;
    CUresult s = cuMemGetAddressRange_v2(&base, &range, d + 12345);
    // The size is exact for a granularity multiple; for an odd size it is the driver's rounding.
    std::string values = kv("base_off", static_cast<long long>(base) - static_cast<long long>(d));
    if (size % (2 * mib) == 0) values += " " + kv("size", static_cast<long long>(range));
    print_case(name, s, values);
    std::printf("info %s size %zu\n", name.c_str(), range);
    // (Each status is taken before its values are formatted: argument order is unspecified.)
    // A NULL size pointer is allowed; whether the base is still written is the driver's choice,
    // so the flag says it and the offset only counts when it was.
    CUdeviceptr base_only = 0;
    s = cuMemGetAddressRange_v2(&base_only, nullptr, d + size - 1);
    std::string base_values = kv("base_written", base_only != 0);
    if (base_only != 0)
      base_values += " " + kv("base_off", static_cast<long long>(base_only) - static_cast<long long>(d));
    print_case(name + ".null_size", s, base_values);

    unsigned int mem_type = 0;
    s = cuPointerGetAttribute(&mem_type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, d + 100);
    print_case("cuPointerGetAttribute_memtype_" + std::to_string(size), s, kv("type", mem_type));
    int ordinal = -1;
    s = cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, d + 100);
    print_case("cuPointerGetAttribute_ordinal_" + std::to_string(size), s, kv("ordinal", ordinal));
    CUdeviceptr start = 0;
    size_t range_size = 0;
    CUresult s1 = cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, d + 100);
    CUresult s2 = cuPointerGetAttribute(&range_size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, d + 100);
    print_case("cuPointerGetAttribute_range_" + std::to_string(size), s1 != CUDA_SUCCESS ? s1 : s2,
               kv("start_off", static_cast<long long>(start) - static_cast<long long>(d)));
    std::printf("info cuPointerGetAttribute_range_%zu size %zu\n", size, range_size);
    VMMCKPT_CHECK(cuMemFree_v2(d));
  }
  {
    std::vector<char> host(64);
    CUdeviceptr base = 0;
    size_t range = 0;
    print_case("cuMemGetAddressRange_host",
               cuMemGetAddressRange_v2(&base, &range, reinterpret_cast<CUdeviceptr>(host.data())));
  }
  {
    CUdeviceptr d = 0x1234;
    CUresult s = cuMemAlloc_v2(&d, pib);
    print_case("cuMemAlloc_1PiB", s);
    if (s == CUDA_SUCCESS) VMMCKPT_CHECK(cuMemFree_v2(d));
  }
  {
    CUdeviceptr d = 0;
    size_t pitch = 0;
    CUresult s = cuMemAllocPitch_v2(&d, &pitch, 1000, 10, 4);
    print_case("cuMemAllocPitch_w1000", s, kv("pitch_ge_width", pitch >= 1000));
    std::printf("info cuMemAllocPitch_w1000 pitch %zu\n", pitch);
    if (s == CUDA_SUCCESS) {
      gpu_check::print_ptr(d, pitch * 10, "cuMemAllocPitch");
      VMMCKPT_CHECK(cuMemFree_v2(d));
    }
  }
}

}  // namespace

int main() {
  VMMCKPT_CHECK(cudaSetDevice(0));
  VMMCKPT_CHECK(cudaFree(nullptr));  // primary context: the driver calls below use it
  cudaStream_t stream;
  VMMCKPT_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  runtime_cases(stream);
  driver_cases();
  VMMCKPT_CHECK(cudaStreamDestroy(stream));
  print_case("final_device_synchronize", cudaDeviceSynchronize());
  print_case("final_last_error", cudaGetLastError());
  return 0;
}
