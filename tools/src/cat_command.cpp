// `cuda-ckpt cat`: write an image's bytes for an address range, every extent's checksum checked before any of its bytes go out.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cli_options.hpp"
#include "commands.hpp"
#include "byte_sink.hpp"
#include "exit_codes.hpp"
#include "vmmckpt/image/image.hpp"
#include "vmmckpt/image/staging_name.hpp"
#include "vmmckpt/pool/pool_layout.hpp"

namespace vmmckpt::tools {

int cat_command(const std::string& path, const std::string& addr_text, const std::string& size_text,
                const std::string& output) {
  std::uint64_t addr = 0, size = 0;
  if (!parse_size(addr_text, addr) || addr_text.find_first_not_of("0123456789abcdefABCDEFxX") != std::string::npos) {
    std::fprintf(stderr, "cuda-ckpt cat: ADDR '%s' is not an address (0x hex or decimal)\n", addr_text.c_str());
    return exit_usage;
  }
  if (!parse_size(size_text, size) || size == 0) {
    std::fprintf(stderr, "cuda-ckpt cat: SIZE '%s' is not a size of at least 1 (0x hex or decimal, K/M/G/T)\n",
                 size_text.c_str());
    return exit_usage;
  }
  if (size > ~std::uint64_t{0} - addr) {
    std::fprintf(stderr, "cuda-ckpt cat: %s + %s runs past the end of the address space\n", addr_text.c_str(),
                 size_text.c_str());
    return exit_usage;
  }

  const auto reader = image::reader::open(path);
  // The library names a byte the image does not hold before anything goes out, and checks every
  // extent touched before its bytes do: the memory needed is the largest extent touched.
  byte_sink out(output);
  reader.read_range(addr, size, [&](const unsigned char* bytes, std::size_t n) { out.write(bytes, n); });
  out.commit();
  return exit_ok;
}

subcommand add_cat(CLI::App& app) {
  struct options {
    std::string image, addr, size, output;
  };
  auto o = std::make_shared<options>();
  auto* command = app.add_subcommand("cat", "Write an image's bytes for an address range, every checksum checked");
  add_image(command, o->image);
  command->add_option("addr", o->addr, "First address (0x hex or decimal)")->required()->type_name("ADDR");
  command->add_option("size", o->size, "Number of bytes (0x hex or decimal, K/M/G/T)")->required()->type_name("SIZE");
  command
      ->add_option("-o,--output", o->output, "Write to this file (created 0600, only when complete) instead of stdout")
      ->type_name("FILE");
  command->footer(
      "Usage: cuda-ckpt cat IMAGE ADDR SIZE [-o FILE]   (also: cuda-ckpt cat -D IMAGE ADDR SIZE)\n"
      "Each extent the range touches is read whole and its checksum checked before any of its bytes are written.\n"
      "Exit status 1, naming it, when a byte of the range is in no extent (nothing is written) or an extent is\n"
      "damaged (the bytes before it, all checked, may have been written; with -o no file is left).");

  return {command, [o] { return cat_command(o->image, o->addr, o->size, o->output); }};
}

}  // namespace vmmckpt::tools
