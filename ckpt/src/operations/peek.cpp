// peek, poke and regions: one request each on the control channel; a peek's bytes read from the sealed file the
// program filled (copy), or from its memory mapped into this tool's own context (map).
#include "vmmckpt/ckpt/peek.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/cuda_check.hpp"
#include "vmmckpt/ckpt/control_client.hpp"
#include "vmmckpt/ckpt/driver.hpp"
#include "vmmckpt/ckpt/errors.hpp"
#include "vmmckpt/support/hex_text.hpp"

namespace vmmckpt::ckpt {
namespace {

using clock = std::chrono::steady_clock;

// The connection's deadline: the hold (quiesce) and the copy, with room to connect.
deadline peek_deadline(std::chrono::milliseconds hold) { return deadline::in(control_deadline + hold); }

// copy: the program's sealed file, exactly the range's size.
std::string read_copied(int fd, std::uint64_t size) {
  const int seals = ::fcntl(fd, F_GET_SEALS);
  struct stat st {};
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0 || ::fstat(fd, &st) != 0 ||
      static_cast<std::uint64_t>(st.st_size) != size)
    throw tool_error("the program sent its copy in a file that is not sealed or not " + std::to_string(size) +
                     " bytes long");
  std::string bytes(size, '\0');
  for (std::uint64_t done = 0; done < size;) {
    const ssize_t n = ::pread(fd, bytes.data() + done, size - done, static_cast<off_t>(done));
    if (n <= 0) throw tool_error("reading the program's copy failed: " + std::string(std::strerror(errno)));
    done += static_cast<std::uint64_t>(n);
  }
  return bytes;
}

// One imported handle mapped read-only in this tool's context, for as long as this lives.
class mapped_piece {
 public:
  mapped_piece(const driver_api& d, CUdevice device, int fd, std::uint64_t handle_size) : d_(d), size_(handle_size) {
    VMMCKPT_CUDA_TRY(d_.cuMemImportFromShareableHandle(&handle_, reinterpret_cast<void*>(static_cast<intptr_t>(fd)),
                                                       CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    imported_ = true;
    VMMCKPT_CUDA_TRY(d_.cuMemAddressReserve(&va_, size_, 0, 0, 0));
    VMMCKPT_CUDA_TRY(d_.cuMemMap(va_, size_, 0, handle_, 0));
    mapped_ = true;
    CUmemAccessDesc access{};
    access.location = {CU_MEM_LOCATION_TYPE_DEVICE, device};
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READ;
    VMMCKPT_CUDA_TRY(d_.cuMemSetAccess(va_, size_, &access, 1));
  }
  ~mapped_piece() {
    if (mapped_) d_.cuMemUnmap(va_, size_);
    if (va_ != 0) d_.cuMemAddressFree(va_, size_);
    if (imported_) d_.cuMemRelease(handle_);
  }
  mapped_piece(const mapped_piece&) = delete;
  mapped_piece& operator=(const mapped_piece&) = delete;
  CUdeviceptr at(std::uint64_t offset) const { return va_ + offset; }

 private:
  const driver_api& d_;
  std::uint64_t size_;
  CUmemGenericAllocationHandle handle_{};
  CUdeviceptr va_ = 0;
  bool imported_ = false, mapped_ = false;
};

// map: each piece's handle mapped here in turn and its part of the range copied out.
std::string read_mapped(const control::peek_reply& reply, received_fds& fds) {
  const driver_api& d = driver();
  VMMCKPT_CUDA_TRY(d.cuInit(0));
  CUdevice device = 0;
  VMMCKPT_CUDA_TRY(d.cuDeviceGet(&device, reply.range.device));
  CUcontext context = nullptr;
  VMMCKPT_CUDA_TRY(d.cuDevicePrimaryCtxRetain(&context, device));
  VMMCKPT_CUDA_TRY(d.cuCtxSetCurrent(context));
  std::string bytes(reply.range.size, '\0');
  for (std::size_t i = 0; i < reply.pieces.size(); ++i) {
    const control::peek_piece& p = reply.pieces[i];
    const int fd = fds.take(i);
    const mapped_piece mapped(d, device, fd, p.handle_size);
    ::close(fd);  // the import holds the memory
    VMMCKPT_CUDA_TRY(d.cuMemcpyDtoH_v2(bytes.data() + (p.addr - reply.range.addr), mapped.at(p.offset), p.size));
  }
  d.cuDevicePrimaryCtxRelease_v2(device);
  return bytes;
}

// copy unless the range is large and this tool can map it.
control::peek_path chosen_path(const peek_options& o) {
  if (o.via) return *o.via;
  if (o.size <= peek_map_above) return control::peek_path::copy;
  try {
    driver();
    return control::peek_path::map;
  } catch (const tool_error&) {
    return control::peek_path::copy;  // no driver here: the program copies
  }
}

}  // namespace

peek_result peek(const peek_options& options) {
  const auto start = clock::now();
  const control::peek_path via = chosen_path(options);
  if (via == control::peek_path::map) driver();  // no driver here: say so before the program is asked
  control_client client(options.pid, peek_deadline(options.hold_deadline));
  received_fds fds;
  peek_result result;
  result.reply = client.peek(
      control::peek_request{options.addr, options.size, options.name, options.order, via, options.hold_deadline, 0},
      fds);
  if (via == control::peek_path::copy) {
    const int fd = fds.take(0);
    try {
      result.bytes = read_copied(fd, result.reply.range.size);
    } catch (...) {
      ::close(fd);
      throw;
    }
    ::close(fd);
  } else {
    result.bytes = read_mapped(result.reply, fds);
  }
  result.seconds = std::chrono::duration<double>(clock::now() - start).count();
  return result;
}

control::poke_reply poke(const poke_options& options) {
  if (options.bytes.empty()) throw tool_error("nothing to write: the file is empty");
  const int fd = ::memfd_create("vmmckpt-poke", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) throw tool_error("cannot make the poke's file: " + std::string(std::strerror(errno)));
  struct closer {
    int fd;
    ~closer() { ::close(fd); }
  } close_at_end{fd};
  for (std::size_t done = 0; done < options.bytes.size();) {
    const ssize_t n = ::write(fd, options.bytes.data() + done, options.bytes.size() - done);
    if (n <= 0) throw tool_error("cannot write the poke's file: " + std::string(std::strerror(errno)));
    done += static_cast<std::size_t>(n);
  }
  if (::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) != 0)
    throw tool_error("cannot seal the poke's file: " + std::string(std::strerror(errno)));
  control_client client(options.pid, peek_deadline(options.hold_deadline));
  return client.poke(
      control::poke_request{options.addr, options.bytes.size(), options.name, options.order, options.hold_deadline, 0},
      fd);
}

control::regions_reply regions(pid_t pid) {
  control_client client(pid);
  return client.regions();
}

}  // namespace vmmckpt::ckpt
