// `cuda-ckpt inspect` and `cuda-ckpt verify`: read an image and report on it.
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli_options.hpp"
#include "commands.hpp"
#include "exit_codes.hpp"
#include "image_access.hpp"
#include "output.hpp"
#include "vmmckpt/ckpt/job_image.hpp"
#include "vmmckpt/ckpt/process_image.hpp"
#include "vmmckpt/image/image.hpp"

namespace vmmckpt::tools {

namespace {

// inspect's first lines: where the image comes from, what it holds in all, and what it leaves to others.
void print_summary(const std::string& path, const image::reader& reader) {
  const auto& m = reader.info();
  // What the image says of itself is shown escaped: another user's program chose its command line.
  const std::string command = shown_command(m.command);
  std::printf("image     %s (format %u, written by vmmckpt %s)\n", shown(path).c_str(), m.format,
              shown(m.tool_version).c_str());
  std::printf("created   %s on %s\n", shown(m.created).c_str(), shown(m.host).c_str());
  std::printf("process   %lld: %s\n", static_cast<long long>(m.pid), command.c_str());
  if (m.parent)
    std::printf("data      %s in this image, %s with its parents; program held %.1f ms\n",
                human_bytes(m.data_bytes).c_str(), human_bytes(image::restored_bytes(m)).c_str(), m.hold_us / 1000.0);
  else
    std::printf("data      %s; program held %.1f ms\n", human_bytes(m.data_bytes).c_str(), m.hold_us / 1000.0);
  if (const std::uint64_t zero = image::zero_bytes_of(m); zero != 0)
    std::printf("zero      %s of blocks that hold only zeros: recorded, not stored, restored as zeros\n",
                human_bytes(zero).c_str());
  if (!m.lacking.empty()) std::printf("partial: lacks %s\n", shown(kinds_and_sizes(m.lacking)).c_str());
  for (const auto& i : m.ipc_imports)
    std::printf("imported  %s of process %lld (its %#llx) at %#llx through CUDA IPC: recorded, not stored\n",
                human_bytes(i.size).c_str(), static_cast<long long>(i.exporter_pid),
                static_cast<unsigned long long>(i.exporter_base), static_cast<unsigned long long>(i.addr));
  if (m.parent)
    std::printf("parent    %s (image %s): blocks unchanged since it are read from it; chain %s\n",
                shown(reader.parent()->dir().string()).c_str(), shown(m.parent->image_id).c_str(),
                shown(chain_text(reader)).c_str());
  for (const auto& d : m.devices)
    std::printf("device    %d: %s %s (compute capability %d.%d)\n", d.ordinal, shown(d.name).c_str(),
                shown(d.uuid).c_str(), d.cc_major, d.cc_minor);
}

// The program-made VMM memory of the image: its reservations, handles, mappings and imports.
void print_vmm_layout(const vmm_layout& l) {
  std::printf("vmm       program-made VMM memory: %zu reservations, %zu handles, %zu mappings (windows at 0x%llx, "
              "%s each)\n",
              l.reservations.size(), l.handles.size(), l.mappings.size(),
              static_cast<unsigned long long>(l.windows.base), human_bytes(l.windows.window).c_str());
  std::printf("  %-18s %14s  %s\n", "reservation", "bytes", "device");
  for (const auto& r : l.reservations)
    std::printf("  0x%-16llx %14llu  %d\n", static_cast<unsigned long long>(r.addr),
                static_cast<unsigned long long>(r.size), r.device);
  std::printf("  %-18s %14s  %6s %4s\n", "handle", "bytes", "device", "refs");
  for (const auto& h : l.handles)
    std::printf("  0x%-16llx %14llu  %6d %4u\n", static_cast<unsigned long long>(h.token),
                static_cast<unsigned long long>(h.size), h.device, h.refs);
  std::printf("  %-18s %14s  %-18s %s\n", "mapping", "bytes", "handle", "offset");
  for (const auto& x : l.mappings)
    std::printf("  0x%-16llx %14llu  0x%-16llx %llu\n", static_cast<unsigned long long>(x.addr),
                static_cast<unsigned long long>(x.size), static_cast<unsigned long long>(x.token),
                static_cast<unsigned long long>(x.offset));
  for (const auto& x : l.imports)
    std::printf("imported  %s of process %lld (its handle 0x%llx, %s) at 0x%llx: recorded, not stored\n",
                human_bytes(x.size).c_str(), static_cast<long long>(x.exporter_pid),
                static_cast<unsigned long long>(x.token), x.device_uuid.empty() ? "host memory" : x.device_uuid.c_str(),
                static_cast<unsigned long long>(x.addr));
}

// One pool: its allocations, and the extents that store their bytes.
void print_pool(const image::pool& p) {
  std::printf("%s device %d at 0x%llx, %s reserved, %zu allocations\n",
              p.kind == image::pool_kind::vmm ? "vmm pool " : "pool     ", p.device,
              static_cast<unsigned long long>(p.base), human_bytes(p.size).c_str(), p.allocations.size());
  std::printf("  %-18s %14s  %s\n", "address", "bytes", "api");
  for (const auto& a : p.allocations)
    std::printf("  0x%-16llx %14llu  %s\n", static_cast<unsigned long long>(a.addr),
                static_cast<unsigned long long>(a.size), std::string(name_of(a.api)).c_str());
  std::printf("extents   %zu (address ranges whose allocations' bytes are stored together)\n", p.extents.size());
  std::printf("  %-18s %14s %14s %5s  %s\n", "address", "range", "stored", "file", "checksum");
  for (const auto& e : p.extents)
    std::printf("  0x%-16llx %14llu %14llu %5u  %016llx\n", static_cast<unsigned long long>(e.addr),
                static_cast<unsigned long long>(e.size), static_cast<unsigned long long>(e.stored), e.file,
                static_cast<unsigned long long>(e.checksum));
}

}  // namespace

int inspect_command(const std::string& path, bool as_json) {
  if (ckpt::is_process_image(path)) return inspect_process_command(path, as_json);
  if (ckpt::is_job_nodes_image(path)) return inspect_job_nodes_command(path, as_json);
  if (ckpt::is_job_image(path)) return inspect_job_command(path, as_json);
  const auto reader = image::reader::open(path);
  const auto& m = reader.info();
  if (as_json) {
    // The manifest, and what it implies: the bytes of its zero blocks (recorded, not stored).
    auto j = nlohmann::json::parse(image::to_json(m));
    j["zero_bytes"] = image::zero_bytes_of(m);
    std::cout << j.dump(2) << "\n";
    return exit_ok;
  }
  print_summary(path, reader);
  if (m.vmm) print_vmm_layout(*m.vmm);
  for (const auto& p : m.pools) print_pool(p);
  return exit_ok;
}

int verify_command(const std::string& path, bool as_json) {
  if (const std::string why = unreadable_image_directory(path); !why.empty())
    return report_failure("verify", as_json, path + ": cannot be read (" + why + "); nothing was checked",
                          exit_failure);
  try {
    if (ckpt::is_process_image(path)) return verify_process_command(path, as_json);
    if (ckpt::is_job_nodes_image(path)) return verify_job_nodes_command(path, as_json);
    if (ckpt::is_job_image(path)) return verify_job_command(path, as_json);
    const auto reader = image::reader::open(path);
    reader.verify_data();
    const auto& lacking = reader.info().lacking;
    if (as_json) {
      std::cout << nlohmann::json{{"image", path},
                                  {"ok", true},
                                  {"partial", !lacking.empty()},
                                  {"chain", chain_length(reader)},
                                  {"lacking", kinds_and_sizes_json(lacking)}}
                       .dump(2)
                << "\n";
    } else {
      std::printf("%s: good (%s, every checksum matches)\n", path.c_str(),
                  human_bytes(image::restored_bytes(reader.info())).c_str());
      if (reader.parent() != nullptr)
        std::printf("%s: incremental: its unchanged blocks were checked in its parents too: %s\n", path.c_str(),
                    chain_text(reader).c_str());
      // Good as what it is: an image that says what it lacks.
      if (!lacking.empty()) std::printf("%s: partial: lacks %s\n", path.c_str(), kinds_and_sizes(lacking).c_str());
    }
    return exit_ok;
  } catch (const image::image_error& e) {
    return report_defect(path, as_json, e.what());
  }
}

namespace {

// A subcommand of one image and --json.
subcommand add_image_command(CLI::App& app, const char* name, const char* help, const char* json_help,
                             int (*run)(const std::string& image, bool json)) {
  struct options {
    std::string image;
    bool json = false;
  };
  auto o = std::make_shared<options>();
  auto* command = app.add_subcommand(name, help);
  add_image(command, o->image);
  command->add_flag("--json", o->json, json_help);
  return {command, [o, run] { return run(o->image, o->json); }};
}

}  // namespace

subcommand add_inspect(CLI::App& app) {
  return add_image_command(app, "inspect", "Summarize an image and list its allocations", "Print the manifest as JSON",
                           inspect_command);
}

subcommand add_verify(CLI::App& app) {
  return add_image_command(app, "verify", "Check an image's structure and every checksum", "Print the result as JSON",
                           verify_command);
}

}  // namespace vmmckpt::tools
