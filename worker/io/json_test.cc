// Tests of the JSON value, parser and writer: round trips, escaping, exact
// integers, shortest doubles, non-finite values as strings, parse errors with
// their byte offsets, and ParseJson (simdjson) against ParseJsonBytewise.
#include "worker/io/json.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace keel {
namespace {

JsonValue MustParse(const std::string& text) {
  JsonValue v;
  Status s = ParseJson(text, &v);
  EXPECT_TRUE(s.ok()) << text << ": " << s.message();
  return v;
}

std::string ParseError(const std::string& text) {
  JsonValue v = "unchanged";
  Status s = ParseJson(text, &v);
  EXPECT_FALSE(s.ok()) << "accepted: " << text;
  EXPECT_EQ(v, JsonValue("unchanged"));
  return s.message();
}

// Each text is refused with exactly its message.
void ExpectParseErrors(const std::vector<std::pair<std::string, std::string>>& cases) {
  for (const auto& c : cases) EXPECT_EQ(ParseError(c.first), c.second) << "text: " << c.first;
}

TEST(JsonTest, ParsesEveryTypeAndKeepsMemberOrder) {
  JsonValue v = MustParse(
      " {\"z\": null, \"a\": [true, false, -1.5e2, \"s\"], \"m\": {\"k\": 0}} \n");
  ASSERT_TRUE(v.is_object());
  ASSERT_EQ(v.size(), 3u);
  EXPECT_EQ(v.members()[0].first, "z");
  EXPECT_EQ(v.members()[1].first, "a");
  EXPECT_EQ(v.members()[2].first, "m");
  EXPECT_TRUE(v.Find("z")->is_null());
  const JsonValue& a = *v.Find("a");
  ASSERT_EQ(a.size(), 4u);
  EXPECT_TRUE(a.array()[0].bool_value());
  EXPECT_TRUE(a.array()[1].is_bool());
  EXPECT_FALSE(a.array()[1].bool_value());
  EXPECT_EQ(a.array()[2].number(), -150.0);
  EXPECT_EQ(a.array()[3].string_value(), "s");
  EXPECT_EQ(v.Find("m")->Find("k")->int_value(), 0);
  EXPECT_EQ(v.Find("missing"), nullptr);
}

TEST(JsonTest, WriterIsCompactAndRoundTrips) {
  const std::string text =
      "{\"b\":[1,-2,3.25,\"x\",null,true,{}],\"a\":{\"n\":[[]],\"e\":\"\"},\"c\":-0.001}";
  JsonValue v = MustParse(text);
  EXPECT_EQ(ToJson(v), text);
  EXPECT_EQ(MustParse(ToJson(v)), v);
}

TEST(JsonTest, BuiltValuesSerialize) {
  JsonValue v = JsonValue::Object();
  v.Set("step", 7);
  v.Set("name", "run-1");
  JsonValue list = JsonValue::Array();
  list.Append(1.5);
  list.Append(false);
  list.Append(nullptr);
  v.Set("list", list);
  v.Set("step", int64_t{8});  // replaces in place, keeps the position
  EXPECT_EQ(ToJson(v), "{\"step\":8,\"name\":\"run-1\",\"list\":[1.5,false,null]}");
}

TEST(JsonTest, StringEscapingRoundTrips) {
  const std::string raw =
      std::string("q\"b\\s/\b\f\n\r\t\x01\x1f\x7f", 14) + "\xC3\xA9\xF0\x9F\x98\x80";
  const std::string json = ToJson(JsonValue(raw));
  EXPECT_EQ(json, std::string("\"q\\\"b\\\\s/\\b\\f\\n\\r\\t\\u0001\\u001f\x7f") +
                      "\xC3\xA9\xF0\x9F\x98\x80\"");
  EXPECT_EQ(MustParse(json).string_value(), raw);
  // A NUL byte inside a string survives.
  const std::string nul("a\0b", 3);
  EXPECT_EQ(ToJson(JsonValue(nul)), "\"a\\u0000b\"");
  EXPECT_EQ(MustParse(ToJson(JsonValue(nul))).string_value(), nul);
}

TEST(JsonTest, UnicodeEscapesDecodeToUtf8IncludingSurrogatePairs) {
  EXPECT_EQ(MustParse("\"\\u00e9\\u20AC\\ud83d\\ude00\\/\"").string_value(),
            "\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80/");
  EXPECT_EQ(MustParse("\"\\u0000\"").string_value(), std::string(1, '\0'));
}

TEST(JsonTest, WriterReplacesInvalidUtf8WithReplacementCharacter) {
  EXPECT_EQ(ToJson(JsonValue(std::string("a\xFF" "b\xC3", 4))),
            "\"a\xEF\xBF\xBD" "b\xEF\xBF\xBD\"");
}

TEST(JsonTest, IntegersAreExactBeyondDoublePrecision) {
  const int64_t big = (int64_t{1} << 53) + 1;  // not a double
  JsonValue v = MustParse("[9007199254740993, -9223372036854775808, 9223372036854775807]");
  EXPECT_EQ(v.array()[0].int_value(), big);
  EXPECT_EQ(v.array()[1].int_value(), INT64_MIN);
  EXPECT_EQ(v.array()[2].int_value(), INT64_MAX);
  EXPECT_EQ(ToJson(v), "[9007199254740993,-9223372036854775808,9223372036854775807]");
  EXPECT_EQ(ToJson(JsonValue(big)), "9007199254740993");
  // Above INT64_MAX a uint64 keeps only its double: 2^64, written exactly.
  EXPECT_EQ(ToJson(JsonValue(uint64_t{18446744073709551615u})), "18446744073709551616");
  // Beyond int64: a double only.
  JsonValue huge = MustParse("9223372036854775808");
  EXPECT_FALSE(huge.is_int());
  EXPECT_EQ(huge.number(), 9223372036854775808.0);
}

TEST(JsonTest, IntegralDoublesHaveIntsButNegativeZeroKeepsItsSign) {
  EXPECT_TRUE(MustParse("1e3").is_int());
  EXPECT_EQ(MustParse("1e3").int_value(), 1000);
  EXPECT_TRUE(MustParse("2.0").is_int());
  EXPECT_FALSE(MustParse("2.5").is_int());
  JsonValue neg_zero = MustParse("-0");
  EXPECT_FALSE(neg_zero.is_int());
  EXPECT_TRUE(std::signbit(neg_zero.number()));
  EXPECT_EQ(ToJson(JsonValue(-0.0)), "-0");
  EXPECT_TRUE(std::signbit(MustParse(ToJson(JsonValue(-0.0))).number()));
}

TEST(JsonTest, DoublesUseTheShortestFormThatRoundTrips) {
  EXPECT_EQ(JsonNumber(0.1), "0.1");
  EXPECT_EQ(JsonNumber(1.0 / 3.0), "0.3333333333333333");
  EXPECT_EQ(JsonNumber(2.5), "2.5");
  EXPECT_EQ(JsonNumber(1e300), "1e+300");
  EXPECT_EQ(JsonNumber(5e-324), "5e-324");
  EXPECT_EQ(JsonNumber(static_cast<double>(3.14159f)), "3.141590118408203");
  std::mt19937_64 rng(1);
  for (int i = 0; i < 20000; ++i) {
    uint64_t bits = rng();
    double d;
    std::memcpy(&d, &bits, sizeof(d));
    if (!std::isfinite(d)) continue;
    const std::string text = ToJson(JsonValue(d));
    JsonValue back = MustParse(text);
    ASSERT_TRUE(back.is_number()) << text;
    ASSERT_EQ(back.number(), d) << text;
    ASSERT_EQ(std::signbit(back.number()), std::signbit(d)) << text;
  }
}

TEST(JsonTest, NonFiniteDoublesAreWrittenAsStringsAndReadBack) {
  const double inf = std::numeric_limits<double>::infinity();
  JsonWriter w;
  w.Add("nan", std::nan("")).Add("inf", inf).Add("ninf", -inf).Add("x", 1.25);
  EXPECT_EQ(w.str(), "{\"nan\":\"NaN\",\"inf\":\"Infinity\",\"ninf\":\"-Infinity\",\"x\":1.25}");
  JsonValue v = MustParse(w.str());
  double d = 0;
  ASSERT_TRUE(v.Find("nan")->ToDouble(&d));
  EXPECT_TRUE(std::isnan(d));
  ASSERT_TRUE(v.Find("inf")->ToDouble(&d));
  EXPECT_EQ(d, inf);
  ASSERT_TRUE(v.Find("ninf")->ToDouble(&d));
  EXPECT_EQ(d, -inf);
  ASSERT_TRUE(v.Find("x")->ToDouble(&d));
  EXPECT_EQ(d, 1.25);
  d = 7;
  EXPECT_FALSE(JsonValue("nan").ToDouble(&d));  // only the writer's exact spellings
  EXPECT_FALSE(JsonValue(true).ToDouble(&d));
  EXPECT_EQ(d, 7);
}

TEST(JsonTest, WriterBuildsOneLineObjects) {
  JsonWriter w;
  EXPECT_EQ(w.str(), "{}");
  w.Add("step", 10).Add("loss", 2.5).Add("scheme", "mxfp8_e4m3").Add("ok", true);
  w.Add("tag\n\"q\"", std::string("a\tb")).Add("n", JsonValue());
  const std::string line = w.str();
  EXPECT_EQ(line,
            "{\"step\":10,\"loss\":2.5,\"scheme\":\"mxfp8_e4m3\",\"ok\":true,"
            "\"tag\\n\\\"q\\\"\":\"a\\tb\",\"n\":null}");
  EXPECT_EQ(line.find('\n'), std::string::npos);
  EXPECT_EQ(MustParse(line).Find("tag\n\"q\"")->string_value(), "a\tb");
  w.Clear();
  w.Add("a", size_t{3});
  EXPECT_EQ(w.str(), "{\"a\":3}");
}

TEST(JsonTest, ParseErrorsGiveTheByteOffsetAndWhatWasExpected) {
  ExpectParseErrors({
      {"", "JSON: at byte 0: expected a value, found end of input"},
      {"{\"a\" 1}", "JSON: at byte 5: expected ':' after object key, found '1'"},
      {"[1,]",
       "JSON: at byte 3: expected a value (object, array, string, number, true, false or null)"
       ", found ']'"},
      {"{\"a\":1,}", "JSON: at byte 7: expected '\"' starting an object key, found '}'"},
      {"[1 2]", "JSON: at byte 3: expected ',' or ']' after array element, found '2'"},
      {"{\"a\":1} x", "JSON: at byte 8: expected end of input after the value, found 'x'"},
      {"tru", "JSON: at byte 3: expected 'true', found end of input"},
      {"nul!", "JSON: at byte 3: expected 'null', found '!'"},
      {"\"abc", "JSON: at byte 4: expected '\"' closing the string, found end of input"},
      {"\"a\nb\"",
       "JSON: at byte 2: expected a string character (control characters must be escaped)"
       ", found byte 0x0A"},
      {"\"\\x\"",
       "JSON: at byte 2: expected an escape character (one of \" \\ / b f n r t u), found 'x'"},
      {"\"\\u12g4\"", "JSON: at byte 5: expected 4 hex digits after \\u, found 'g'"},
      {"\"\\ude00\"",
       "JSON: at byte 1: expected a high surrogate before a low surrogate \\u escape"
       ", found '\\'"},
      {"\"\\ud83d x\"",
       "JSON: at byte 7: expected a low surrogate \\uDC00-\\uDFFF after a high surrogate"
       ", found ' '"},
      {"\"a\xC3(\"", "JSON: at byte 2: expected valid UTF-8, found byte 0xC3"},
      {"{\"k\":1,\"k\":2}", "JSON: at byte 7: expected a unique object key, found a second \"k\""},
  });
}

TEST(JsonTest, NumberGrammarIsStrict) {
  ExpectParseErrors({
      {"01",
       "JSON: at byte 1: expected no leading zero ('.', 'e' or the end of the number)"
       ", found '1'"},
      {"-", "JSON: at byte 1: expected a digit, found end of input"},
      {"1.", "JSON: at byte 2: expected a digit after '.', found end of input"},
      {"1e+", "JSON: at byte 3: expected a digit in the exponent, found end of input"},
      {"[1e999]", "JSON: at byte 1: expected a number within the range of a double, found '1'"},
  });
  ParseError("+1");
  ParseError(".5");
  ParseError("NaN");
  ParseError("Infinity");
  ParseError("0x10");
  EXPECT_EQ(MustParse("1e-999").number(), 0.0);  // underflow rounds to zero
  EXPECT_EQ(MustParse("-12.5E-1").number(), -1.25);
}

TEST(JsonTest, DeepNestingIsRefusedNotACrash) {
  const std::string ok = std::string(kMaxJsonDepth, '[') + std::string(kMaxJsonDepth, ']');
  MustParse(ok);
  const std::string deep = std::string(kMaxJsonDepth + 1, '[') +
                           std::string(kMaxJsonDepth + 1, ']');
  EXPECT_EQ(ParseError(deep), "JSON: at byte " + std::to_string(kMaxJsonDepth) +
                                  ": expected nesting no deeper than 512, found '['");
  ParseError(std::string(100000, '['));
}

TEST(JsonTest, WrongTypeAccessorsReturnDefaults) {
  JsonValue s("text");
  EXPECT_EQ(s.number(), 0.0);
  EXPECT_EQ(s.int_value(), 0);
  EXPECT_FALSE(s.bool_value());
  EXPECT_TRUE(s.array().empty());
  EXPECT_TRUE(s.members().empty());
  EXPECT_EQ(s.Find("x"), nullptr);
  EXPECT_EQ(JsonValue(3).string_value(), "");
  EXPECT_EQ(s.size(), 0u);
}

TEST(JsonTest, NegativeZeroKeepsItsSignWhereverItStands) {
  // simdjson reads "-0" as the integer 0; ParseJson must not.
  JsonValue v = MustParse("{\"a\":[0,-0],\"b\":-0,\"c\":\"x-0\",\"d\":-0.5}");
  EXPECT_TRUE(std::signbit(v.Find("a")->array()[1].number()));
  EXPECT_FALSE(v.Find("a")->array()[1].is_int());
  EXPECT_TRUE(v.Find("a")->array()[0].is_int());
  EXPECT_TRUE(std::signbit(v.Find("b")->number()));
  EXPECT_EQ(ToJson(v), "{\"a\":[0,-0],\"b\":-0,\"c\":\"x-0\",\"d\":-0.5}");
  EXPECT_TRUE(std::signbit(MustParse("-0e5").number()));
}

TEST(JsonTest, IntegersBeyondSixtyFourBitsReadAsDoubles) {
  // simdjson refuses these; they are valid JSON and read as before.
  JsonValue v = MustParse("[18446744073709551616, -9223372036854775809, 123456789012345678901234567890]");
  ASSERT_EQ(v.size(), 3u);
  EXPECT_FALSE(v.array()[0].is_int());
  EXPECT_EQ(v.array()[0].number(), 18446744073709551616.0);
  EXPECT_EQ(v.array()[1].number(), -9223372036854775809.0);
  EXPECT_EQ(v.array()[2].number(), 123456789012345678901234567890.0);
  EXPECT_EQ(MustParse(ToJson(JsonValue(uint64_t{18446744073709551615u}))).number(), 18446744073709551616.0);
}

TEST(JsonTest, DuplicateKeysAreRefusedInLargeObjectsToo) {
  std::string text = "{";
  for (int i = 0; i < 40; ++i) text += "\"k" + std::to_string(i) + "\":" + std::to_string(i) + ",";
  MustParse(text.substr(0, text.size() - 1) + "}");
  const std::string dup = text + "\"k17\":0}";
  EXPECT_EQ(ParseError(dup), "JSON: at byte " + std::to_string(text.size()) +
                                 ": expected a unique object key, found a second \"k17\"");
  // Nested: the inner object's duplicate.
  EXPECT_EQ(ParseError("{\"a\":{\"x\":1,\"x\":1},\"x\":2}"),
            "JSON: at byte 12: expected a unique object key, found a second \"x\"");
}

TEST(JsonTest, ObjectNestingHasTheSameLimitAsArrays) {
  std::string ok;
  for (int i = 0; i < kMaxJsonDepth; ++i) ok += "{\"a\":";
  ok += "1" + std::string(kMaxJsonDepth, '}');
  MustParse(ok);
  EXPECT_EQ(ParseError("{\"a\":" + ok + "}"),
            "JSON: at byte " + std::to_string(5 * kMaxJsonDepth) + ": expected nesting no deeper than 512, found '{'");
}

TEST(JsonTest, DocumentsBeyondAMegabyteParse) {
  std::string text = "[";
  while (text.size() < (size_t{3} << 20)) text += "{\"saturated\":0.000123456789,\"name\":\"h.11.mlp.c_fc\"},";
  text.back() = ']';
  JsonValue v = MustParse(text);
  ASSERT_GT(v.size(), 10000u);
  EXPECT_EQ(v.array().back().Find("saturated")->number(), 0.000123456789);
  // And a small one after it, on the same thread.
  EXPECT_EQ(MustParse("[1]").array()[0].int_value(), 1);
}

TEST(JsonTest, ThreadsParseAtTheSameTime) {
  std::vector<std::thread> threads;
  std::vector<int> failures(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([t, &failures] {
      for (int i = 0; i < 2000; ++i) {
        const std::string text = "{\"step\":" + std::to_string(i) + ",\"t\":" + std::to_string(t) + "}";
        JsonValue v;
        if (!ParseJson(text, &v).ok() || v.Find("step")->int_value() != i || v.Find("t")->int_value() != t) {
          ++failures[t];
        }
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(failures, std::vector<int>(4, 0));
}

// ParseJson reads with simdjson and hands what simdjson refuses to
// ParseJsonBytewise; the two must give the same result on every input. Valid
// documents of every kind, mutated byte by byte into near misses.
TEST(JsonTest, ParseJsonAgreesWithTheBytewiseParserOnMutatedDocuments) {
  const std::vector<std::string> seeds = {
      "{\"step\":12,\"attempt\":1,\"unix_ms\":1767225600972,\"loss\":3.2841796875,\"lr\":0.0006,"
      "\"scheme\":\"mxfp8_e4m3\",\"grad_norm\":\"Infinity\",\"grad_norm_layers\":{\"embed\":0.25,\"0\":1e-05},"
      "\"quant\":{\"h.0.attn.c_attn\":{\"fwd_x\":{\"saturated\":0.000123,\"nan_blocks\":0}}},"
      "\"probe\":{\"cosine\":0.99,\"zeta\":-0.0123},\"skipped\":true}",
      "[0,-0,1e3,-0.0,2.0,9223372036854775807,9223372036854775808,18446744073709551616,1e-999,-12.5E-1,5e-324]",
      "{\"b\":[1,-2,3.25,\"x\",null,true,false,{}],\"a\":{\"n\":[[]],\"e\":\"\"},\"c\":-0.001}",
      "\"q\\\"b\\\\s\\/\\b\\f\\n\\r\\t\\u0001\\u00e9\\ud83d\\ude00\xC3\xA9\xF0\x9F\x98\x80\"",
      " {\"z\": null, \"a\" : [ true , false ] }\n",
  };
  const std::string alphabet = std::string("-+0123456789.eE\"\\u{}[],: \n\tntfalsrx/") + "\x01\x7f\xC3\xA9\xFF\xED";
  std::mt19937 rng(11);
  int accepted = 0;
  for (int i = 0; i < 30000; ++i) {
    std::string text = seeds[rng() % seeds.size()];
    const int edits = 1 + static_cast<int>(rng() % 3);
    for (int e = 0; e < edits && !text.empty(); ++e) {
      const size_t pos = rng() % text.size();
      const char c = alphabet[rng() % alphabet.size()];
      switch (rng() % 3) {
        case 0: text[pos] = c; break;
        case 1: text.insert(text.begin() + pos, c); break;
        default: text.erase(pos, 1);
      }
    }
    JsonValue fast = "unchanged", bytewise = "unchanged";
    const Status a = ParseJson(text, &fast);
    const Status b = ParseJsonBytewise(text, &bytewise);
    ASSERT_EQ(a.ok(), b.ok()) << text;
    if (a.ok()) {
      ++accepted;
      ASSERT_EQ(fast, bytewise) << text;
      ASSERT_EQ(ToJson(fast), ToJson(bytewise)) << text;  // tells -0 from 0
    } else {
      ASSERT_EQ(a.message(), b.message()) << text;
      ASSERT_EQ(fast, JsonValue("unchanged")) << text;
    }
  }
  // The mutations must reach both outcomes, or the test proves little.
  EXPECT_GT(accepted, 1000);
  EXPECT_LT(accepted, 29000);
}

}  // namespace
}  // namespace keel
