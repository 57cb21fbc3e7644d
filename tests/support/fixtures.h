// Where tests find the golden fixtures: $LAIR_FIXTURES, else the folder
// configured at build time (../shared/fixtures beside the checkout).
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

#include "gtest/gtest.h"

namespace lair::testing {

inline std::string FixturesDir() {
  if (const char* env = std::getenv("LAIR_FIXTURES"); env != nullptr && *env != '\0') return env;
  return LAIR_DEFAULT_FIXTURES_DIR;
}

inline std::string CorpusDir() {
  if (const char* env = std::getenv("LAIR_CORPUS"); env != nullptr && *env != '\0') return env;
  return LAIR_DEFAULT_CORPUS_DIR;
}

}  // namespace lair::testing

// Skips the current test, saying why, when `relative` is not under the
// fixtures folder. Declares `path` (std::string) for the test body.
#define LAIR_FIXTURE_OR_SKIP(path, relative)                                      \
  const std::string path = ::lair::testing::FixturesDir() + "/" + (relative);     \
  if (!std::filesystem::exists(path)) {                                           \
    GTEST_SKIP() << "fixture " << path << " is absent (set LAIR_FIXTURES to the " \
                 << "shared/fixtures folder to run this test)";                   \
  }
