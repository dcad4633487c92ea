// Catch2 main for the end-to-end tests on the emulated driver.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
