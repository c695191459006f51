// detail::json_quoted: the same bytes as nlohmann's dump of a string, on every ASCII byte, ragged
// lengths, UTF-8 text, and text that is not UTF-8 (refused as nlohmann refuses it).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "tierswap/detail/json.hpp"

namespace tierswap {
namespace {

std::string reference(const std::string& s) {
  return nlohmann::json(s).dump();
}

TEST(JsonQuoted, EveryAsciiByteAsNlohmannWritesIt) {
  for (int b = 0; b < 0x80; ++b) {
    const std::string s = "a" + std::string(1, static_cast<char>(b)) + "z";
    EXPECT_EQ(detail::json_quoted(s), reference(s)) << "byte " << b;
  }
  EXPECT_EQ(detail::json_quoted(""), "\"\"");
  EXPECT_EQ(detail::json_quoted("\"\\\n\x01\x7f"), "\"\\\"\\\\\\n\\u0001\x7f\"");
}

TEST(JsonQuoted, RaggedRandomTextMatches) {
  std::mt19937 rng(7);
  const std::string ascii = "ab\"\\{}:,\n\t\r\b\f\x1f\x7f 09";
  for (int len = 0; len < 300; len += 1 + len / 16) {
    for (int rep = 0; rep < 8; ++rep) {
      std::string s;
      for (int i = 0; i < len; ++i) {
        const std::size_t k = rng() % (ascii.size() + 1);
        if (k == ascii.size())
          s += "\xc3\xa9";  // é: UTF-8, through nlohmann's path
        else
          s += ascii[k];
      }
      EXPECT_EQ(detail::json_quoted(s), reference(s)) << "length " << len;
    }
  }
}

TEST(JsonQuoted, TextThatIsNotUtf8IsRefusedAsNlohmannRefusesIt) {
  for (const std::string s : {std::string("ab\xff"), std::string("\xc3"), std::string("x\x80y")}) {
    EXPECT_THROW(reference(s), nlohmann::json::type_error);
    EXPECT_THROW(detail::json_quoted(s), nlohmann::json::type_error) << s;
  }
}

}  // namespace
}  // namespace tierswap
