// A minimal assertion helper for the host-side C++ tests (no framework needed).
#pragma once

#include <cstdio>
#include <cstdlib>

static int g_failures = 0;

#define CHECK(cond)                                                          \
  do {                                                                       \
    if (!(cond)) {                                                           \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      ++g_failures;                                                          \
    }                                                                        \
  } while (0)

#define TEST_MAIN_END()                                                      \
  do {                                                                       \
    if (g_failures) {                                                        \
      std::fprintf(stderr, "%d check(s) failed\n", g_failures);              \
      return EXIT_FAILURE;                                                   \
    }                                                                        \
    std::printf("all checks passed\n");                                      \
    return EXIT_SUCCESS;                                                     \
  } while (0)
