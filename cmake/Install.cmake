# What `cmake --install` and `cpack -G DEB` put where: the tool, the shim, the docs, the man page,
# bash completion and the CMake package config (README.md, section Install).
include(CMakePackageConfigHelpers)

install(TARGETS cuda-ckpt EXPORT vmmckptTargets RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS vmmckpt EXPORT vmmckptTargets LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
# The CRIU plugin goes where CRIU looks for plugins: lib/criu under the prefix, /usr/lib/criu for the .deb (not
# the multiarch library directory: CRIU's default is that fixed path).
if(TARGET vmmckpt_criu)
  install(TARGETS vmmckpt_criu LIBRARY DESTINATION lib/criu)
endif()
# The in-process API (vmmckpt_pause / vmmckpt_resume): a program that includes it and links vmmckpt::vmmckpt,
# or looks the functions up at run time under the preloaded shim.
install(FILES ${PROJECT_SOURCE_DIR}/shim/include/vmmckpt/vmmckpt.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/vmmckpt)
# No emulated driver either: it is test infrastructure, and would shadow the real libcuda.so.1.

install(FILES README.md CHANGELOG.md DESTINATION ${CMAKE_INSTALL_DOCDIR})
file(GLOB _vmmckpt_docs ${PROJECT_SOURCE_DIR}/docs/*.md)
install(FILES ${_vmmckpt_docs} DESTINATION ${CMAKE_INSTALL_DOCDIR}/docs)

# The man page comes from the built tool's help, which needs no CUDA driver.
set(_vmmckpt_man_page ${CMAKE_BINARY_DIR}/share/man/man1/cuda-ckpt.1)
set(_vmmckpt_man_script ${PROJECT_SOURCE_DIR}/tools/man/generate_man_page.cmake)
add_custom_command(
  OUTPUT ${_vmmckpt_man_page}
  COMMAND ${CMAKE_COMMAND} -DCUDA_CKPT=$<TARGET_FILE:cuda-ckpt> -DOUTPUT=${_vmmckpt_man_page}
          -DVERSION=${PROJECT_VERSION} -P ${_vmmckpt_man_script}
  DEPENDS cuda-ckpt ${_vmmckpt_man_script}
  COMMENT "Generating the man page cuda-ckpt.1 from cuda-ckpt --help"
  VERBATIM)
add_custom_target(cuda-ckpt-man ALL DEPENDS ${_vmmckpt_man_page})
install(FILES ${_vmmckpt_man_page} DESTINATION ${CMAKE_INSTALL_MANDIR}/man1)

# What a whole-process checkpoint's errors point at: the script that provisions CRIU without touching the system.
install(PROGRAMS ${PROJECT_SOURCE_DIR}/scripts/provision-criu.sh DESTINATION ${CMAKE_INSTALL_DATADIR}/vmmckpt)

install(FILES ${PROJECT_SOURCE_DIR}/tools/completion/cuda-ckpt.bash
        DESTINATION ${CMAKE_INSTALL_DATADIR}/bash-completion/completions RENAME cuda-ckpt)

# find_package(vmmckpt): vmmckpt::vmmckpt (the shim), vmmckpt::cuda-ckpt, and their paths as variables.
set(_vmmckpt_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/vmmckpt)
install(EXPORT vmmckptTargets NAMESPACE vmmckpt:: DESTINATION ${_vmmckpt_cmake_dir})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/vmmckptConfig.cmake.in
  ${CMAKE_BINARY_DIR}/vmmckptConfig.cmake
  INSTALL_DESTINATION ${_vmmckpt_cmake_dir}
  PATH_VARS CMAKE_INSTALL_BINDIR CMAKE_INSTALL_LIBDIR)
# Before 1.0 a minor version may break the image format or the command line.
write_basic_package_version_file(${CMAKE_BINARY_DIR}/vmmckptConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/vmmckptConfig.cmake ${CMAKE_BINARY_DIR}/vmmckptConfigVersion.cmake
        DESTINATION ${_vmmckpt_cmake_dir})

# The .deb: `cpack -G DEB` in the build directory. No libcuda dependency: the driver comes with the
# GPU driver's own install, not as a Debian package we could name.
set(VMMCKPT_PACKAGE_MAINTAINER "vmmckpt maintainers <maintainers@users.noreply.a-seed-62d9b048.example>"
    CACHE STRING "Maintainer field of the .deb")
set(CPACK_PACKAGE_NAME vmmckpt)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "Deterministic-address checkpoint/restart for CUDA programs")
set(CPACK_PACKAGE_DESCRIPTION
    "An LD_PRELOAD shim (libvmmckpt.so) serves every device allocation of an unmodified CUDA program from a pool at a fixed virtual address; the cuda-ckpt command dumps, suspends, resumes and restores its GPU memory at the same addresses.")
set(CPACK_PACKAGE_CONTACT "${VMMCKPT_PACKAGE_MAINTAINER}")
set(CPACK_DEBIAN_PACKAGE_MAINTAINER "${VMMCKPT_PACKAGE_MAINTAINER}")
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION utils)
# What a build with Debian 12's toolchain needs (GLIBC_2.34, GLIBCXX_3.4.30): set by hand because
# dpkg-shlibdeps would stop at libcuda.so.1, which no Debian package of ours provides.
set(VMMCKPT_DEB_DEPENDS "libc6 (>= 2.34), libstdc++6 (>= 12), libgcc-s1 (>= 3.0)" CACHE STRING "Depends field of the .deb")
set(CPACK_DEBIAN_PACKAGE_DEPENDS "${VMMCKPT_DEB_DEPENDS}")
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "bash-completion")
# Debug info stays in the build tree: the package is a tenth of the size.
set(CPACK_STRIP_FILES ON)
set(CPACK_GENERATOR DEB)
include(CPack)
