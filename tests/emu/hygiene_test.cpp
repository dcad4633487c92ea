// libvmmckpt.so exports only the intercepted names and depends on nothing but glibc and libstdc++.
#include <catch2/catch.hpp>

#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "process.hpp"

using vmmckpt::test::run_process;

namespace {

const std::string shim = std::string(VMMCKPT_BUILD_DIR) + "/lib/libvmmckpt.so";

std::set<std::string> lines_of(const std::string& text) {
  std::set<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.insert(line);
  return out;
}

// The names listed under `global:` in the version script.
std::set<std::string> version_script_names() {
  std::ifstream in(VMMCKPT_VERSION_SCRIPT);
  std::stringstream text;
  text << in.rdbuf();
  const std::string s = text.str();
  const auto begin = s.find("global:");
  const auto end = s.find("local:");
  std::set<std::string> names;
  const std::regex name(R"([A-Za-z_][A-Za-z0-9_]*)");
  const std::string body = s.substr(begin + 7, end - begin - 7);
  for (auto it = std::sregex_iterator(body.begin(), body.end(), name); it != std::sregex_iterator(); ++it)
    names.insert(it->str());
  return names;
}

}  // namespace

TEST_CASE("the shim exports exactly the intercepted symbols", "[emu][hygiene]") {
  const auto r = run_process({"sh", "-c", "nm -D --defined-only '" + shim + "' | awk '{print $3}'"});
  REQUIRE(r.exit_code == 0);
  const auto exported = lines_of(r.out);
  const auto expected = version_script_names();
  REQUIRE(expected.size() > 20);
  REQUIRE(exported == expected);
  for (const auto& name : exported) {
    INFO(name);
    REQUIRE(name.find("spdlog") == std::string::npos);
    REQUIRE(name.find("fmt") == std::string::npos);
  }
}

TEST_CASE("the shim links neither libcuda, libcudart, spdlog nor fmt", "[emu][hygiene]") {
  const auto r = run_process({"sh", "-c", "readelf -d '" + shim + "' | sed -n 's/.*NEEDED.*\\[\\(.*\\)\\]/\\1/p'"});
  REQUIRE(r.exit_code == 0);
  const std::set<std::string> allowed = {"libc.so.6", "libstdc++.so.6", "libgcc_s.so.1", "libm.so.6",
                                         "ld-linux-x86-64.so.2", "ld-linux-aarch64.so.1", "libdl.so.2",
                                         "libpthread.so.0"};
  const auto needed = lines_of(r.out);
  REQUIRE_FALSE(needed.empty());
  for (const auto& lib : needed) {
    INFO(lib);
    REQUIRE(allowed.count(lib) == 1);
  }
  // And no undefined CUDA symbol waits for a library to provide it.
  const auto undefined = run_process({"sh", "-c", "nm -D --undefined-only '" + shim + "' | grep -c ' cu' || true"});
  REQUIRE(undefined.out == "0\n");
}
