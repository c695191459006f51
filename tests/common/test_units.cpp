#include <gtest/gtest.h>

#include "tierswap/units.hpp"

using namespace tierswap;

TEST(Units, ParsesPlainAndSuffixedSizes) {
  EXPECT_EQ(parse_size("0"), 0u);
  EXPECT_EQ(parse_size("4096"), 4096u);
  EXPECT_EQ(parse_size("64KiB"), 64u * 1024);
  EXPECT_EQ(parse_size("1MiB"), 1u << 20);
  EXPECT_EQ(parse_size("1M"), 1u << 20);
  EXPECT_EQ(parse_size("2GiB"), 2ull << 30);
  EXPECT_EQ(parse_size("2gib"), 2ull << 30);
  EXPECT_EQ(parse_size("1.5GiB"), 3ull << 29);
  EXPECT_EQ(parse_size("10MB"), 10'000'000u);
  EXPECT_EQ(parse_size("1TB"), 1'000'000'000'000ull);
  EXPECT_EQ(parse_size(" 8 KiB "), 8192u);
  EXPECT_EQ(parse_size("17B"), 17u);
}

TEST(Units, RejectsBadSizesNamingTheKey) {
  for (const char* bad : {"", "abc", "-1", "1XB", "1.3B", "99999999999999999999", "16777216TiB"}) {
    try {
      parse_size(bad, "--size");
      FAIL() << "accepted " << bad;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("--size"), std::string::npos) << e.what();
    }
  }
}

TEST(Units, ParsesDurationsAndRejectsBadOnesNamingTheKey) {
  EXPECT_EQ(parse_duration("0"), 0.0);
  EXPECT_EQ(parse_duration("90"), 90.0);
  EXPECT_EQ(parse_duration("90s"), 90.0);
  EXPECT_EQ(parse_duration("15m"), 900.0);
  EXPECT_EQ(parse_duration("1.5h"), 5400.0);
  EXPECT_EQ(parse_duration("7d"), 7 * 86400.0);
  for (const char* bad :
       {"", "d", "-1h", "1w", "1 h", "inf", "nan", "1e400", " 5", "5ms", "0x10"}) {
    try {
      parse_duration(bad, "--older-than");
      FAIL() << "accepted '" << bad << "'";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("--older-than"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(format_duration(45), "45 s");
  EXPECT_EQ(format_duration(900), "15 min");
  EXPECT_EQ(format_duration(9000), "2.5 h");
  EXPECT_EQ(format_duration(7 * 86400), "7 d");
}

TEST(Units, FormatsBytes) {
  EXPECT_EQ(format_bytes(17), "17 B");
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(format_bytes(2ull << 30), "2.00 GiB");
}

TEST(Units, Rounding) {
  EXPECT_EQ(round_up(0, 4096), 0u);
  EXPECT_EQ(round_up(1, 4096), 4096u);
  EXPECT_EQ(round_up(4096, 4096), 4096u);
  EXPECT_EQ(round_down(4097, 4096), 4096u);
}
