// JSON string literals written fast (detail/json.hpp): one pass sizes the literal, a second
// writes it; text that is not ASCII goes to nlohmann, which also checks its UTF-8.
#include <array>
#include <cstdint>

#include "tierswap/detail/json.hpp"

namespace tierswap::detail {

namespace {

// What each byte becomes: its own length in the literal (1: as it is, 2: a short escape such as
// \n, 6: \u00XX), 0 for a byte that is not ASCII.
constexpr std::array<std::uint8_t, 256> kLength = [] {
  std::array<std::uint8_t, 256> n{};
  for (int b = 0; b < 0x80; ++b) n[b] = 1;
  for (int b = 0; b < 0x20; ++b) n[b] = 6;
  for (int b : {'"', '\\', '\b', '\f', '\n', '\r', '\t'}) n[b] = 2;
  return n;
}();

constexpr std::array<char, 256> kShort = [] {  // the letter after '\' of a short escape
  std::array<char, 256> c{};
  c['"'] = '"';
  c['\\'] = '\\';
  c['\b'] = 'b';
  c['\f'] = 'f';
  c['\n'] = 'n';
  c['\r'] = 'r';
  c['\t'] = 't';
  return c;
}();

char* put_escaped(char* o, unsigned char b) {
  static constexpr char kHex[] = "0123456789abcdef";
  *o++ = '\\';
  if (kLength[b] == 2) {
    *o++ = kShort[b];
    return o;
  }
  *o++ = 'u';
  *o++ = '0';
  *o++ = '0';
  *o++ = kHex[b >> 4];
  *o++ = kHex[b & 15];
  return o;
}

}  // namespace

std::string json_quoted(std::string_view text) {
  std::size_t size = 2;
  for (const char ch : text) {
    const std::uint8_t n = kLength[static_cast<unsigned char>(ch)];
    if (n == 0) return nlohmann::json(std::string(text)).dump();
    size += n;
  }
  std::string out(size, '"');
  char* o = out.data() + 1;
  for (const char ch : text) {
    const auto b = static_cast<unsigned char>(ch);
    if (kLength[b] == 1)
      *o++ = ch;
    else
      o = put_escaped(o, b);
  }
  return out;  // the closing quote: the last byte, as filled
}

}  // namespace tierswap::detail
