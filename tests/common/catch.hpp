// One include for Catch2 2.x (Debian's package) and Catch2 3.x: tests include this, never Catch2 directly.
#pragma once

#if __has_include(<catch2/catch_all.hpp>)
#include <catch2/catch_all.hpp>
#define SPG_CATCH_VERSION 3
#else
#include <catch2/catch.hpp>
#define SPG_CATCH_VERSION 2
#endif
