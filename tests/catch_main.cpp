// One Catch2 main shared by every component's unit tests (compiled once).
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
