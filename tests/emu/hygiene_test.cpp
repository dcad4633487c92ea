// libvmmckpt.so exports only the intercepted names and depends on nothing but glibc and libstdc++; cuda-ckpt links no libcuda.
#include <catch2/catch.hpp>

#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "e2e_support.hpp"

using vmmckpt::test::file_text;
using vmmckpt::test::run_process;
using vmmckpt::test::shim;

namespace {

std::set<std::string> lines_of(const std::string& text) {
  std::set<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.insert(line);
  return out;
}

// The names the shim means to export: dlsym and every entry of its three lists, served_entry_points.inc,
// gated_entry_points.inc and nccl_entry_points.inc (the version script is generated from the same lists).
std::set<std::string> intended_exports() {
  std::set<std::string> names = {"dlsym"};
  for (const char* list : {VMMCKPT_SERVED_LIST, VMMCKPT_GATED_LIST, VMMCKPT_NCCL_LIST}) {
    const std::string text = file_text(list);
    const std::regex entry(R"(\n(VMMCKPT_SERVED_DRIVER|VMMCKPT_SERVED_RUNTIME|VMMCKPT_GATED|VMMCKPT_NCCL)\((\w+)[,)])");
    for (auto it = std::sregex_iterator(text.begin(), text.end(), entry); it != std::sregex_iterator(); ++it)
      names.insert((*it)[2].str());
  }
  // The in-process API: each function the public header declares.
  const std::string header = file_text(VMMCKPT_API_HEADER);
  const std::regex declared(R"(\n[a-z][^\n(]*[ *](vmmckpt_\w+)\()");
  for (auto it = std::sregex_iterator(header.begin(), header.end(), declared); it != std::sregex_iterator(); ++it)
    names.insert((*it)[1].str());
  return names;
}

// The libraries an ELF file names as NEEDED in its dynamic section.
std::set<std::string> needed_libraries(const std::string& file) {
  const auto r = run_process({"sh", "-c", "readelf -d '" + file + "' | sed -n 's/.*NEEDED.*\\[\\(.*\\)\\]/\\1/p'"});
  REQUIRE(r.exit_code == 0);
  return lines_of(r.out);
}

}  // namespace

TEST_CASE("the shim exports exactly the intercepted symbols", "[emu][hygiene]") {
  const auto r = run_process({"sh", "-c", "nm -D --defined-only '" + shim + "' | awk '{print $3}'"});
  REQUIRE(r.exit_code == 0);
  const auto exported = lines_of(r.out);
  const auto expected = intended_exports();
  REQUIRE(expected.size() > 150);
  REQUIRE(exported == expected);
  for (const auto& name : exported) {
    INFO(name);
    REQUIRE(name.find("spdlog") == std::string::npos);
    REQUIRE(name.find("fmt") == std::string::npos);
  }
}

TEST_CASE("the shim links neither libcuda, libcudart, spdlog nor fmt", "[emu][hygiene]") {
  const std::set<std::string> allowed = {"libc.so.6",  "libstdc++.so.6",       "libgcc_s.so.1",
                                         "libm.so.6",  "ld-linux-x86-64.so.2", "ld-linux-aarch64.so.1",
                                         "libdl.so.2", "libpthread.so.0"};
  const auto needed = needed_libraries(shim);
  REQUIRE_FALSE(needed.empty());
  for (const auto& lib : needed) {
    INFO(lib);
    // A sanitized build (scripts/sanitize.sh) needs its sanitizer runtimes too.
    REQUIRE((allowed.count(lib) == 1 || lib.rfind("libasan.so", 0) == 0 || lib.rfind("libubsan.so", 0) == 0));
  }
  // And no undefined CUDA symbol waits for a library to provide it.
  const auto undefined = run_process({"sh", "-c", "nm -D --undefined-only '" + shim + "' | grep -c ' cu' || true"});
  REQUIRE(undefined.out == "0\n");
}

// So that inspect, verify, ps and gc run where there is no driver (tests/emu/no_driver_e2e_test.cpp runs them).
TEST_CASE("cuda-ckpt links no libcuda", "[emu][hygiene]") {
  const auto needed = needed_libraries(std::string(VMMCKPT_BUILD_DIR) + "/bin/cuda-ckpt");
  REQUIRE(needed.count("libc.so.6") == 1);  // the dynamic section was read
  for (const auto& lib : needed) {
    INFO(lib);
    REQUIRE(lib.find("libcuda") == std::string::npos);
    REQUIRE(lib.find("libnvidia") == std::string::npos);
  }
  // And no CUDA symbol waits for a library to provide it.
  const auto undefined = run_process(
      {"sh", "-c",
       "nm -D --undefined-only '" + std::string(VMMCKPT_BUILD_DIR) + "/bin/cuda-ckpt' | grep -c ' cu[A-Z]' || true"});
  REQUIRE(undefined.out == "0\n");
}

TEST_CASE("every served entry point is reached through every door", "[emu][hygiene]") {
  const std::string programs = std::string(VMMCKPT_BUILD_DIR) + "/tests/programs";
  const auto r = run_process({std::string(VMMCKPT_BUILD_DIR) + "/bin/cuda-ckpt", "run", "--",
                              programs + "/emu_served_doors", programs + "/fake-cudart/libcudart.so.13"});
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  REQUIRE(r.out.find("mismatches 0") != std::string::npos);
}

TEST_CASE("entry points called while every allocation fails return a code and work again after", "[emu][hygiene]") {
  const auto r = run_process({std::string(VMMCKPT_BUILD_DIR) + "/bin/cuda-ckpt", "run", "--",
                              std::string(VMMCKPT_BUILD_DIR) + "/tests/programs/emu_no_memory"},
                             {{"VMMCKPT_LOG_LEVEL", "trace"}});
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  REQUIRE(r.out.find("survived") != std::string::npos);
}
