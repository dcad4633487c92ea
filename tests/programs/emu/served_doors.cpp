// Emulator test program: every entry point the shim serves is reached through every door a program may use.
//
// Run under the shim with the path of a stand-in libcudart (fake_cudart.cpp). The doors: the
// exported symbol, dlsym on a libcuda handle, cuGetProcAddress (v1 and v2, at the version each ABI
// appeared in and at this toolkit's), and cudaGetDriverEntryPoint / ByVersion (and their _ptsz
// forms). The entries come from the shim's own lists, served_entry_points.inc and
// gated_entry_points.inc. Prints one line per mismatch and the counts; exits 1 on any mismatch.
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

namespace {

struct served {
  const char* symbol;
  const char* proc_name;
  int since;
  const char* twin;
  bool driver;
};

const served served_entries[] = {
#define VMMCKPT_SERVED_DRIVER(symbol, proc_name, since, twin) {#symbol, proc_name, since, twin, true},
#define VMMCKPT_SERVED_RUNTIME(symbol) {#symbol, nullptr, 0, nullptr, false},
#include "entry/served_entry_points.inc"  // NOLINT: the shim's own list
#undef VMMCKPT_SERVED_DRIVER
#undef VMMCKPT_SERVED_RUNTIME
};

const char* const gated_entries[] = {
#define VMMCKPT_GATED(name, params, args) #name,
#include "entry/gated_entry_points.inc"
#undef VMMCKPT_GATED
};

using get_proc_v2_fn = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
using get_proc_v1_fn = CUresult (*)(const char*, void**, int, cuuint64_t);
using entry_point_fn = cudaError_t (*)(const char*, void**, unsigned long long, cudaDriverEntryPointQueryResult*);
using entry_point_by_version_fn = cudaError_t (*)(const char*, void**, unsigned int, unsigned long long,
                                                  cudaDriverEntryPointQueryResult*);

int mismatches = 0;
int checked = 0;

void expect(bool ok, const std::string& what) {
  ++checked;
  if (!ok) {
    ++mismatches;
    std::printf("MISMATCH %s\n", what.c_str());
  }
}

void* shim_handle = nullptr;
std::string shim_path;

void* ours(const char* symbol) { return dlsym(shim_handle, symbol); }

// The served row cuGetProcAddress(name, version) must give: the newest ABI at or below version.
const served* row_for(const char* proc_name, int version) {
  const served* best = nullptr;
  for (const auto& e : served_entries)
    if (e.proc_name != nullptr && std::strcmp(e.proc_name, proc_name) == 0 && e.since <= version &&
        (best == nullptr || e.since > best->since))
      best = &e;
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s FAKE_LIBCUDART\n", argv[0]);
    return 2;
  }
  // The shim itself, found from one of its exports.
  Dl_info info{};
  if (dladdr(dlsym(RTLD_DEFAULT, "cuMemAlloc_v2"), &info) == 0 || info.dli_fname == nullptr) {
    std::fprintf(stderr, "not running under the shim\n");
    return 1;
  }
  shim_path = info.dli_fname;
  shim_handle = dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD);
  void* libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  void* cudart = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);  // see fake_cudart.cpp
  if (shim_handle == nullptr || libcuda == nullptr || cudart == nullptr ||
      std::strstr(shim_path.c_str(), "libvmmckpt") == nullptr) {
    std::fprintf(stderr, "cannot open the shim, libcuda or %s: %s\n", argv[1], dlerror());
    return 1;
  }
  const auto get_proc_v2 = reinterpret_cast<get_proc_v2_fn>(dlsym(libcuda, "cuGetProcAddress_v2"));
  const auto get_proc_v1 = reinterpret_cast<get_proc_v1_fn>(dlsym(libcuda, "cuGetProcAddress"));
  const auto entry_point = reinterpret_cast<entry_point_fn>(dlsym(RTLD_DEFAULT, "cudaGetDriverEntryPoint"));
  const auto entry_point_ptsz = reinterpret_cast<entry_point_fn>(dlsym(RTLD_DEFAULT, "cudaGetDriverEntryPoint_ptsz"));
  const auto by_version =
      reinterpret_cast<entry_point_by_version_fn>(dlsym(RTLD_DEFAULT, "cudaGetDriverEntryPointByVersion"));
  const auto by_version_ptsz =
      reinterpret_cast<entry_point_by_version_fn>(dlsym(RTLD_DEFAULT, "cudaGetDriverEntryPointByVersion_ptsz"));
  if (!get_proc_v2 || !get_proc_v1 || !entry_point || !entry_point_ptsz || !by_version || !by_version_ptsz) {
    std::fprintf(stderr, "a resolver is missing\n");
    return 1;
  }

  int through_libcuda = 0;
  for (const auto& e : served_entries) {
    void* mine = ours(e.symbol);
    expect(mine != nullptr && dlsym(RTLD_DEFAULT, e.symbol) == mine, std::string("symbol ") + e.symbol);
    if (!e.driver) continue;
    // On a libcuda handle: ours, unless this driver lacks the name (then nothing is substituted).
    void* on_handle = dlsym(libcuda, e.symbol);
    expect(on_handle == nullptr || on_handle == mine, std::string("dlsym(libcuda) ") + e.symbol);
    if (on_handle == mine) ++through_libcuda;
    if (e.proc_name == nullptr) continue;
    for (int version : {e.since, CUDA_VERSION}) {
      const served* row = row_for(e.proc_name, version);
      const std::string what = std::string(e.proc_name) + " at " + std::to_string(version);
      void* p = nullptr;
      CUdriverProcAddressQueryResult status{};
      expect(get_proc_v2(e.proc_name, &p, version, 0, &status) == CUDA_SUCCESS && p == ours(row->symbol),
             "cuGetProcAddress_v2 " + what);
      p = nullptr;
      expect(get_proc_v1(e.proc_name, &p, version, 0) == CUDA_SUCCESS && p == ours(row->symbol),
             "cuGetProcAddress " + what);
      p = nullptr;
      cudaDriverEntryPointQueryResult rt_status{};
      expect(
          by_version(e.proc_name, &p, static_cast<unsigned>(version), cudaEnableDefault, &rt_status) == cudaSuccess &&
              p == ours(row->symbol),
          "cudaGetDriverEntryPointByVersion " + what);
      // The per-thread-default-stream forms hand out the twin where there is one.
      const char* per_thread = row->twin != nullptr ? row->twin : row->symbol;
      p = nullptr;
      expect(get_proc_v2(e.proc_name, &p, version, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &status) ==
                     CUDA_SUCCESS &&
                 p == ours(per_thread),
             "cuGetProcAddress_v2 per-thread " + what);
      p = nullptr;
      expect(by_version_ptsz(e.proc_name, &p, static_cast<unsigned>(version), cudaEnableDefault, &rt_status) ==
                     cudaSuccess &&
                 p == ours(per_thread),
             "cudaGetDriverEntryPointByVersion_ptsz " + what);
    }
    // Without a version: the runtime's own (13.0 here).
    const served* row = row_for(e.proc_name, CUDA_VERSION);
    const char* per_thread = row->twin != nullptr ? row->twin : row->symbol;
    void* p = nullptr;
    cudaDriverEntryPointQueryResult rt_status{};
    expect(entry_point(e.proc_name, &p, cudaEnableDefault, &rt_status) == cudaSuccess && p == ours(row->symbol),
           std::string("cudaGetDriverEntryPoint ") + e.proc_name);
    p = nullptr;
    expect(entry_point_ptsz(e.proc_name, &p, cudaEnableDefault, &rt_status) == cudaSuccess && p == ours(per_thread),
           std::string("cudaGetDriverEntryPoint_ptsz ") + e.proc_name);
  }

  // The gated entry points: by symbol and on a libcuda handle their wrappers; through the resolvers,
  // whatever ABI the driver picks for a base name lands in the shim's wrapper of that ABI.
  int gated_resolved = 0;
  for (const char* name : gated_entries) {
    void* mine = ours(name);
    expect(mine != nullptr && dlsym(RTLD_DEFAULT, name) == mine, std::string("gated symbol ") + name);
    void* on_handle = dlsym(libcuda, name);
    expect(on_handle == nullptr || on_handle == mine, std::string("gated dlsym(libcuda) ") + name);
    const std::string base = name;
    if (base.find("_v2") != std::string::npos || base.find("_v3") != std::string::npos ||
        base.find("_pt") != std::string::npos)
      continue;  // an ABI or stream form: reached by its base name's lookup
    // The resolvers substitute what the driver exports; the emulator answers names it does not
    // implement with stubs of its own, which have nothing to substitute.
    if (on_handle == nullptr) continue;
    for (bool runtime_door : {false, true}) {
      void* p = nullptr;
      if (runtime_door) {
        cudaDriverEntryPointQueryResult rt_status{};
        if (by_version(name, &p, CUDA_VERSION, cudaEnableDefault, &rt_status) != cudaSuccess) p = nullptr;
      } else {
        CUdriverProcAddressQueryResult status{};
        if (get_proc_v2(name, &p, CUDA_VERSION, 0, &status) != CUDA_SUCCESS) p = nullptr;
      }
      if (p == nullptr) continue;  // this driver has no such name
      Dl_info where{};
      expect(dladdr(p, &where) != 0 && where.dli_fname != nullptr && shim_path == where.dli_fname &&
                 where.dli_sname != nullptr && std::strncmp(where.dli_sname, name, base.size()) == 0,
             std::string(runtime_door ? "gated cudaGetDriverEntryPointByVersion " : "gated cuGetProcAddress_v2 ") +
                 name + " gave " + (where.dli_sname ? where.dli_sname : "?"));
      ++gated_resolved;
    }
  }
  std::printf("checked %d, mismatches %d, served through libcuda %d, gated through the resolvers %d\n", checked,
              mismatches, through_libcuda, gated_resolved);
  return mismatches == 0 ? 0 : 1;
}
