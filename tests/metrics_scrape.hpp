// A Prometheus scrape parsed strictly, for the suites that read the metrics endpoint.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <regex>
#include <sstream>
#include <string>

namespace tierswap::test {

struct Scrape {
  std::map<std::string, std::string> types;  // family -> counter | gauge
  std::map<std::string, double> samples;     // "name{labels}" -> value
};

// The exposition format 0.0.4 as Prometheus reads it: every line is a HELP, a TYPE (before the
// family's first sample, once) or a sample of a typed family; names and labels well formed.
inline Scrape parse_exposition(const std::string& text) {
  static const std::regex help(R"(^# HELP ([a-zA-Z_:][a-zA-Z0-9_:]*) .*$)");
  static const std::regex type(R"(^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge)$)");
  static const std::regex sample(
      R"(^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\\n]|\\[\\"n])*")(,[a-zA-Z_][a-zA-Z0-9_]*="([^"\\\n]|\\[\\"n])*")*\})? (\S+)$)");
  Scrape s;
  std::istringstream in(text);
  std::string line;
  std::smatch m;
  EXPECT_FALSE(text.empty());
  EXPECT_EQ(text.back(), '\n');
  while (std::getline(in, line)) {
    if (std::regex_match(line, m, help)) continue;
    if (std::regex_match(line, m, type)) {
      EXPECT_TRUE(s.types.emplace(m[1], m[2]).second) << "TYPE twice: " << line;
      continue;
    }
    if (!std::regex_match(line, m, sample)) {
      ADD_FAILURE() << "not a metric line: '" << line << "'";
      continue;
    }
    EXPECT_TRUE(s.types.count(m[1])) << "sample before its TYPE: " << line;
    if (s.types[m[1]] == "counter") EXPECT_TRUE(line.find("_total") != std::string::npos) << line;
    std::size_t used = 0;
    const double v = std::stod(m[m.size() - 1], &used);
    EXPECT_EQ(used, m[m.size() - 1].length()) << line;
    const std::string key = line.substr(0, line.rfind(' '));
    EXPECT_TRUE(s.samples.emplace(key, v).second) << "sample twice: " << line;
  }
  return s;
}

/// The value of the sample `key` ("name{labels}"), -1 when the scrape has none.
inline double sample_value(const Scrape& s, const std::string& key) {
  const auto it = s.samples.find(key);
  return it == s.samples.end() ? -1 : it->second;
}

}  // namespace tierswap::test
