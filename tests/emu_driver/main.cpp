// Catch2 entry point for the emulator's tests.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
