// Can the CPU reach GPU memory through the PCIe BAR with no kernel module, as `cuda-ckpt peek --via bar` would
// (docs/peek.md)? Asks NVIDIA's Vulkan driver, through the Vulkan loader (dlopen'd libvulkan.so.1), three ways:
//
//   import   a chunk made as the shim makes them (cuMemCreate, POSIX FD) imported into Vulkan as an opaque FD,
//            tried at every memory type: does one that is host-visible take it, and read the chunk's bytes?
//   export   Vulkan memory that is device-local and host-visible, exported as an opaque FD and given to CUDA
//            (cuMemImportFromShareableHandle, then cuImportExternalMemory): can CUDA map it at an address the
//            shim picks (cuMemMap), so that a pool's chunks could be BAR-visible?
//   reader   the exported FD imported into a second Vulkan device, as another process would: mapped, read.
//
// Where a host-visible mapping is had, it times CPU reads (memcpy, and non-temporal 16-byte loads) and writes
// through it against cuMemcpy to and from pinned memory, for 4 KiB and --size-mib. One JSON line per finding:
//   {"probe":"bar","step":..,"ok":bool,"detail":..[,"bytes":..,"us":..,"gbps":..]}
//
//   vmmckpt_bench_bar_probe [--size-mib 256] [--rounds 5]
#define VK_NO_PROTOTYPES
#include <cuda.h>
#include <dlfcn.h>
#include <immintrin.h>
#include <unistd.h>
#include <vulkan/vulkan.h>

#include <cstring>
#include <string>
#include <vector>

#include "bench_util.hpp"

namespace {

void report(const char* step, bool ok, const std::string& detail) {
  std::printf("{\"probe\":\"bar\",\"step\":\"%s\",\"ok\":%s,\"detail\":\"%s\"}\n", step, ok ? "true" : "false",
              detail.c_str());
  std::fflush(stdout);
}

void report_speed(const char* step, std::size_t bytes, double seconds) {
  std::printf("{\"probe\":\"bar\",\"step\":\"%s\",\"ok\":true,\"bytes\":%zu,\"us\":%.1f,\"gbps\":%.3f}\n", step, bytes,
              seconds * 1e6, static_cast<double>(bytes) / seconds / 1e9);
  std::fflush(stdout);
}

std::string cu_error(CUresult r) {
  const char* name = nullptr;
  cuGetErrorName(r, &name);
  return name != nullptr ? name : std::to_string(r);
}

// A Vulkan struct of type `type`, every other member zero.
template <class T>
T vk_struct(VkStructureType type, void* next = nullptr) {
  T s{};
  s.sType = type;
  s.pNext = next;
  return s;
}

std::string vk_error(VkResult r) { return "VkResult " + std::to_string(static_cast<int>(r)); }

struct vulkan {
  PFN_vkGetInstanceProcAddr get_instance_proc = nullptr;
  VkInstance instance = VK_NULL_HANDLE;
  template <class F>
  F proc(const char* name) const {
    return reinterpret_cast<F>(get_instance_proc(instance, name));
  }
};

#define VK_FN(v, name) const auto name = (v).proc<PFN_##name>(#name)

bool load_vulkan(vulkan& v) {
  void* lib = dlopen("libvulkan.so.1", RTLD_NOW);
  if (lib == nullptr) {
    report("loader", false, std::string("dlopen libvulkan.so.1: ") + dlerror());
    return false;
  }
  v.get_instance_proc = reinterpret_cast<PFN_vkGetInstanceProcAddr>(dlsym(lib, "vkGetInstanceProcAddr"));
  VK_FN(v, vkCreateInstance);
  auto app = vk_struct<VkApplicationInfo>(VK_STRUCTURE_TYPE_APPLICATION_INFO);
  app.apiVersion = VK_API_VERSION_1_1;
  auto info = vk_struct<VkInstanceCreateInfo>(VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO);
  info.pApplicationInfo = &app;
  const VkResult r = vkCreateInstance(&info, nullptr, &v.instance);
  report("instance", r == VK_SUCCESS, r == VK_SUCCESS ? "Vulkan 1.1 instance" : vk_error(r));
  return r == VK_SUCCESS;
}

// The Vulkan device that is CUDA device 0 (same UUID).
VkPhysicalDevice same_gpu(const vulkan& v, CUdevice cu_device) {
  VK_FN(v, vkEnumeratePhysicalDevices);
  VK_FN(v, vkGetPhysicalDeviceProperties2);
  CUuuid uuid;
  VMMCKPT_CHECK(cuDeviceGetUuid(&uuid, cu_device));
  std::uint32_t n = 0;
  vkEnumeratePhysicalDevices(v.instance, &n, nullptr);
  std::vector<VkPhysicalDevice> devices(n);
  vkEnumeratePhysicalDevices(v.instance, &n, devices.data());
  for (VkPhysicalDevice d : devices) {
    auto id = vk_struct<VkPhysicalDeviceIDProperties>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_ID_PROPERTIES);
    auto props = vk_struct<VkPhysicalDeviceProperties2>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, &id);
    vkGetPhysicalDeviceProperties2(d, &props);
    if (std::memcmp(id.deviceUUID, uuid.bytes, VK_UUID_SIZE) == 0) {
      report("physical_device", true,
             std::string(props.properties.deviceName) + ", driver " + std::to_string(props.properties.driverVersion));
      return d;
    }
  }
  report("physical_device", false, std::to_string(n) + " Vulkan devices, none with CUDA device 0's UUID");
  return VK_NULL_HANDLE;
}

VkDevice make_device(const vulkan& v, VkPhysicalDevice gpu) {
  VK_FN(v, vkCreateDevice);
  const float priority = 1;
  auto queue = vk_struct<VkDeviceQueueCreateInfo>(VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO);
  queue.queueCount = 1;
  queue.pQueuePriorities = &priority;
  const char* extensions[] = {"VK_KHR_external_memory_fd"};
  auto info = vk_struct<VkDeviceCreateInfo>(VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO);
  info.queueCreateInfoCount = 1;
  info.pQueueCreateInfos = &queue;
  info.enabledExtensionCount = 1;
  info.ppEnabledExtensionNames = extensions;
  VkDevice device = VK_NULL_HANDLE;
  const VkResult r = vkCreateDevice(gpu, &info, nullptr, &device);
  if (r != VK_SUCCESS) report("device", false, "vkCreateDevice with VK_KHR_external_memory_fd: " + vk_error(r));
  return r == VK_SUCCESS ? device : VK_NULL_HANDLE;
}

constexpr VkMemoryPropertyFlags bar_flags = VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT | VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT;

std::vector<std::uint32_t> list_memory_types(const vulkan& v, VkPhysicalDevice gpu, int& bar_type) {
  VK_FN(v, vkGetPhysicalDeviceMemoryProperties);
  VkPhysicalDeviceMemoryProperties mem;
  vkGetPhysicalDeviceMemoryProperties(gpu, &mem);
  std::vector<std::uint32_t> flags;
  bar_type = -1;
  for (std::uint32_t i = 0; i < mem.memoryTypeCount; ++i) {
    const auto& t = mem.memoryTypes[i];
    flags.push_back(t.propertyFlags);
    report(
        "memory_type", true,
        "type " + std::to_string(i) + " flags 0x" +
            [&] {
              char b[16];
              std::snprintf(b, sizeof b, "%x", t.propertyFlags);
              return std::string(b);
            }() +
            " heap " + std::to_string(t.heapIndex) + " of " + std::to_string(mem.memoryHeaps[t.heapIndex].size >> 20) +
            " MiB");
    if (bar_type < 0 && (t.propertyFlags & bar_flags) == bar_flags) bar_type = static_cast<int>(i);
  }
  return flags;
}

// Reads through a write-combined mapping 16 bytes at a time with non-temporal loads, which WC memory serves
// far faster than plain loads.
__attribute__((target("sse4.1"))) void stream_read(const void* from, void* to, std::size_t bytes) {
  const auto* src = static_cast<const __m128i*>(from);
  auto* dst = static_cast<__m128i*>(to);
  for (std::size_t i = 0; i < bytes / 16; ++i)
    _mm_store_si128(dst + i, _mm_stream_load_si128(const_cast<__m128i*>(src + i)));
}

template <class Copy>
double best_of(int rounds, Copy copy) {
  double best = 1e30;
  for (int i = 0; i < rounds; ++i) {
    const auto t = bench::clock_type::now();
    copy();
    best = std::min(best, bench::seconds_since(t));
  }
  return best;
}

// CPU reads and writes through `mapped` (host-visible device memory at device address `device_ptr`, or 0 when
// CUDA cannot reach it), against cuMemcpy with pinned memory, for 4 KiB and the whole size.
void time_paths(void* mapped, CUdeviceptr device_ptr, std::size_t size, int rounds) {
  void* pinned = nullptr;
  VMMCKPT_CHECK(cuMemHostAlloc(&pinned, size, 0));
  for (std::size_t bytes : {std::size_t{4096}, size}) {
    const std::string n = bytes == 4096 ? "4k" : "bulk";
    report_speed(("bar_read_memcpy_" + n).c_str(), bytes, best_of(rounds, [&] { std::memcpy(pinned, mapped, bytes); }));
    report_speed(("bar_read_stream_" + n).c_str(), bytes, best_of(rounds, [&] { stream_read(mapped, pinned, bytes); }));
    report_speed(("bar_write_memcpy_" + n).c_str(), bytes, best_of(rounds, [&] {
                   std::memcpy(mapped, pinned, bytes);
                   _mm_sfence();
                 }));
    if (device_ptr != 0) {
      report_speed(("cumemcpy_dtoh_" + n).c_str(), bytes,
                   best_of(rounds, [&] { VMMCKPT_CHECK(cuMemcpyDtoH(pinned, device_ptr, bytes)); }));
      report_speed(("cumemcpy_htod_" + n).c_str(), bytes,
                   best_of(rounds, [&] { VMMCKPT_CHECK(cuMemcpyHtoD(device_ptr, pinned, bytes)); }));
    }
  }
  VMMCKPT_CHECK(cuMemFreeHost(pinned));
}

std::vector<unsigned char> pattern(std::size_t n, unsigned seed) {
  std::vector<unsigned char> p(n);
  for (std::size_t i = 0; i < n; ++i) p[i] = static_cast<unsigned char>((i * 131 + seed) % 251);
  return p;
}

// Imports `fd` (not consumed) into `device` at memory type `type`; mapped when the type is host-visible.
VkDeviceMemory import_fd(const vulkan& v, VkDevice device, int fd, std::size_t size, std::uint32_t type,
                         VkResult& result) {
  VK_FN(v, vkAllocateMemory);
  auto import = vk_struct<VkImportMemoryFdInfoKHR>(VK_STRUCTURE_TYPE_IMPORT_MEMORY_FD_INFO_KHR);
  import.handleType = VK_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD_BIT;
  import.fd = dup(fd);  // Vulkan owns the descriptor on success
  auto info = vk_struct<VkMemoryAllocateInfo>(VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, &import);
  info.allocationSize = size;
  info.memoryTypeIndex = type;
  VkDeviceMemory memory = VK_NULL_HANDLE;
  result = vkAllocateMemory(device, &info, nullptr, &memory);
  if (result != VK_SUCCESS) close(import.fd);
  return result == VK_SUCCESS ? memory : VK_NULL_HANDLE;
}

// Route 1: the shim's kind of chunk, imported into Vulkan.
void probe_import(const vulkan& v, VkDevice device, const std::vector<std::uint32_t>& types, CUdevice cu_device,
                  std::size_t size, int rounds) {
  VK_FN(v, vkMapMemory);
  VK_FN(v, vkFreeMemory);
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location = {CU_MEM_LOCATION_TYPE_DEVICE, cu_device};
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  CUmemGenericAllocationHandle handle;
  VMMCKPT_CHECK(cuMemCreate(&handle, size, &prop, 0));
  CUdeviceptr va;
  VMMCKPT_CHECK(cuMemAddressReserve(&va, size, 0, 0, 0));
  VMMCKPT_CHECK(cuMemMap(va, size, 0, handle, 0));
  CUmemAccessDesc access{{CU_MEM_LOCATION_TYPE_DEVICE, cu_device}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  VMMCKPT_CHECK(cuMemSetAccess(va, size, &access, 1));
  const auto bytes = pattern(4096, 1);
  VMMCKPT_CHECK(cuMemcpyHtoD(va, bytes.data(), bytes.size()));
  int fd = -1;
  VMMCKPT_CHECK(cuMemExportToShareableHandle(&fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  std::string taken;
  for (std::uint32_t t = 0; t < types.size(); ++t) {
    VkResult r;
    VkDeviceMemory memory = import_fd(v, device, fd, size, t, r);
    if (memory == VK_NULL_HANDLE) continue;
    taken += " " + std::to_string(t);
    if ((types[t] & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT) != 0) {
      void* mapped = nullptr;
      r = vkMapMemory(device, memory, 0, size, 0, &mapped);
      const bool same = r == VK_SUCCESS && std::memcmp(mapped, bytes.data(), bytes.size()) == 0;
      report("import_host_visible", same,
             r != VK_SUCCESS ? "vkMapMemory: " + vk_error(r)
             : same          ? "the chunk's bytes read through the BAR"
                             : "mapped, other bytes");
      if (same) time_paths(mapped, va, size, rounds);
    }
    vkFreeMemory(device, memory, nullptr);
  }
  report("import_cuda_chunk", !taken.empty(),
         taken.empty() ? "no memory type takes a cuMemCreate POSIX FD" : "memory types that take it:" + taken);
  close(fd);
  VMMCKPT_CHECK(cuMemUnmap(va, size));
  VMMCKPT_CHECK(cuMemAddressFree(va, size));
  VMMCKPT_CHECK(cuMemRelease(handle));
}

// Route 2: BAR-visible Vulkan memory, given to CUDA at an address of our choosing; then read by a second device.
void probe_export(const vulkan& v, VkPhysicalDevice gpu, VkDevice device, int bar_type, CUdevice cu_device,
                  std::size_t size, int rounds) {
  VK_FN(v, vkAllocateMemory);
  VK_FN(v, vkMapMemory);
  const auto vkGetMemoryFdKHR = reinterpret_cast<PFN_vkGetMemoryFdKHR>(
      v.proc<PFN_vkGetDeviceProcAddr>("vkGetDeviceProcAddr")(device, "vkGetMemoryFdKHR"));
  auto exported = vk_struct<VkExportMemoryAllocateInfo>(VK_STRUCTURE_TYPE_EXPORT_MEMORY_ALLOCATE_INFO);
  exported.handleTypes = VK_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD_BIT;
  auto info = vk_struct<VkMemoryAllocateInfo>(VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, &exported);
  info.allocationSize = size;
  info.memoryTypeIndex = static_cast<std::uint32_t>(bar_type);
  VkDeviceMemory memory = VK_NULL_HANDLE;
  VkResult r = vkAllocateMemory(device, &info, nullptr, &memory);
  report("export_alloc", r == VK_SUCCESS,
         r == VK_SUCCESS ? "device-local host-visible memory, exportable" : vk_error(r));
  if (r != VK_SUCCESS) return;
  void* mapped = nullptr;
  r = vkMapMemory(device, memory, 0, size, 0, &mapped);
  if (r != VK_SUCCESS) return report("export_map", false, vk_error(r));
  const auto bytes = pattern(4096, 2);
  std::memcpy(mapped, bytes.data(), bytes.size());
  _mm_sfence();
  auto get = vk_struct<VkMemoryGetFdInfoKHR>(VK_STRUCTURE_TYPE_MEMORY_GET_FD_INFO_KHR);
  get.memory = memory;
  get.handleType = VK_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD_BIT;
  int fd = -1;
  r = vkGetMemoryFdKHR(device, &get, &fd);
  if (r != VK_SUCCESS) return report("export_fd", false, vk_error(r));

  // As a VMM handle, mappable at a fixed address?
  CUmemGenericAllocationHandle handle;
  CUresult cr = cuMemImportFromShareableHandle(&handle, reinterpret_cast<void*>(static_cast<std::intptr_t>(dup(fd))),
                                               CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  report("vmm_import", cr == CUDA_SUCCESS, "cuMemImportFromShareableHandle: " + cu_error(cr));
  CUdeviceptr fixed = 0;
  if (cr == CUDA_SUCCESS) {
    VMMCKPT_CHECK(cuMemAddressReserve(&fixed, size, 0, 0x7e0000000000ULL, 0));
    cr = cuMemMap(fixed, size, 0, handle, 0);
    CUmemAccessDesc access{{CU_MEM_LOCATION_TYPE_DEVICE, cu_device}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    if (cr == CUDA_SUCCESS) cr = cuMemSetAccess(fixed, size, &access, 1);
    std::vector<unsigned char> back(bytes.size());
    if (cr == CUDA_SUCCESS) cr = cuMemcpyDtoH(back.data(), fixed, back.size());
    report("vmm_map_fixed", cr == CUDA_SUCCESS && back == bytes,
           cr != CUDA_SUCCESS ? cu_error(cr)
           : back == bytes    ? "CUDA reads at the fixed address what the CPU wrote"
                              : "mapped, other bytes");
  }
  // As external memory (Vulkan interop), at an address the driver picks.
  CUDA_EXTERNAL_MEMORY_HANDLE_DESC desc{};
  desc.type = CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD;
  desc.handle.fd = dup(fd);
  desc.size = size;
  CUexternalMemory ext;
  cr = cuImportExternalMemory(&ext, &desc);
  CUdeviceptr ext_ptr = 0;
  if (cr == CUDA_SUCCESS) {
    CUDA_EXTERNAL_MEMORY_BUFFER_DESC buffer{};
    buffer.size = size;
    cr = cuExternalMemoryGetMappedBuffer(&ext_ptr, ext, &buffer);
  }
  std::vector<unsigned char> back(bytes.size());
  if (cr == CUDA_SUCCESS) cr = cuMemcpyDtoH(back.data(), ext_ptr, back.size());
  report("external_memory", cr == CUDA_SUCCESS && back == bytes,
         cr != CUDA_SUCCESS ? cu_error(cr)
         : back == bytes    ? "CUDA reads what the CPU wrote"
                            : "other bytes");
  if (cr == CUDA_SUCCESS) {
    CUmemGenericAllocationHandle retained;
    const CUresult rr = cuMemRetainAllocationHandle(&retained, reinterpret_cast<void*>(ext_ptr));
    report("external_retain", rr == CUDA_SUCCESS, "cuMemRetainAllocationHandle on it: " + cu_error(rr));
  }

  // The reader's side: another device imports the FD, maps it host-visible, reads.
  VkDevice reader = make_device(v, gpu);
  VkDeviceMemory seen = import_fd(v, reader, fd, size, static_cast<std::uint32_t>(bar_type), r);
  void* reader_map = nullptr;
  if (seen != VK_NULL_HANDLE) r = vkMapMemory(reader, seen, 0, size, 0, &reader_map);
  const bool same = reader_map != nullptr && std::memcmp(reader_map, bytes.data(), bytes.size()) == 0;
  report("reader_import", same, same ? "a second device maps it and reads the bytes" : vk_error(r));
  time_paths(same ? reader_map : mapped, fixed != 0 ? fixed : ext_ptr, size, rounds);
  close(fd);
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t size_mib = 256;
  int rounds = 5;
  bench::parse_options(argc, argv, [&](const std::string& name, const std::string& value) {
    if (name == "--size-mib")
      size_mib = std::stoul(value);
    else if (name == "--rounds")
      rounds = std::stoi(value);
    else
      return false;
    return true;
  });
  const std::size_t size = size_mib << 20;
  VMMCKPT_CHECK(cuInit(0));
  CUdevice cu_device;
  VMMCKPT_CHECK(cuDeviceGet(&cu_device, 0));
  CUcontext ctx;
  VMMCKPT_CHECK(cuDevicePrimaryCtxRetain(&ctx, cu_device));
  VMMCKPT_CHECK(cuCtxSetCurrent(ctx));
  vulkan v;
  if (!load_vulkan(v)) return 1;
  VkPhysicalDevice gpu = same_gpu(v, cu_device);
  if (gpu == VK_NULL_HANDLE) return 1;
  VkDevice device = make_device(v, gpu);
  if (device == VK_NULL_HANDLE) return 1;
  int bar_type = -1;
  const auto types = list_memory_types(v, gpu, bar_type);
  report("bar_memory_type", bar_type >= 0,
         bar_type >= 0 ? "type " + std::to_string(bar_type) + " is device-local and host-visible" : "none");
  probe_import(v, device, types, cu_device, size, rounds);
  if (bar_type >= 0) probe_export(v, gpu, device, bar_type, cu_device, size, rounds);
  return 0;
}
