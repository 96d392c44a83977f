// quote(), escaped() and printable(): what error messages do with bytes from files, byte by
// byte: escapes for everything a terminal could act on, the cap, and no double escaping.
#include <gtest/gtest.h>

#include <string>

#include "ringattn/quote.hpp"

namespace ringattn {
namespace {

TEST(Quote, PlainTextIsQuotedUnchanged) {
  EXPECT_EQ(quote("<f8"), "'<f8'");
  EXPECT_EQ(quote(""), "''");
  EXPECT_EQ(escaped("--seq-len"), "--seq-len");
}

TEST(Quote, ControlAndNonAsciiBytesBecomeEscapes) {
  EXPECT_EQ(quote("\x1b[2J"), "'\\x1b[2J'");
  EXPECT_EQ(quote(std::string("a\0b", 3)), "'a\\x00b'");
  EXPECT_EQ(quote("\x7f\x80\xff"), "'\\x7f\\x80\\xff'");
  EXPECT_EQ(quote("\n\r\t"), "'\\n\\r\\t'");
  EXPECT_EQ(escaped("\x1b]0;t\x07"), "\\x1b]0;t\\x07");
}

TEST(Quote, BackslashAndTheQuoteInUseAreEscaped) {
  EXPECT_EQ(quote("a\\b"), "'a\\\\b'");
  EXPECT_EQ(quote("it's"), "\"it's\"");  // as Python's repr
  EXPECT_EQ(quote("it's \"x\""), "'it\\'s \"x\"'");
  EXPECT_EQ(escaped("'x'"), "'x'");
}

TEST(Quote, LongTextIsCutWithAnEllipsisAfterTheQuote) {
  const std::string long_text(100, 'a');
  EXPECT_EQ(quote(long_text), "'" + std::string(kQuoteMaxBytes, 'a') + "'...");
  EXPECT_EQ(quote(std::string(kQuoteMaxBytes, 'a')), "'" + std::string(kQuoteMaxBytes, 'a') + "'");
  EXPECT_EQ(quote("abcdef", 3), "'abc'...");
  EXPECT_EQ(escaped("abcdef", 3), "abc...");
  // The cap counts bytes of the text, not of its escapes.
  EXPECT_EQ(quote("\x1b\x1b\x1b\x1b", 2), "'\\x1b\\x1b'...");
}

TEST(Printable, EscapesControlBytesOnly) {
  EXPECT_EQ(printable("--q (q.npy): unsupported dtype '\\x1b'"),
            "--q (q.npy): unsupported dtype '\\x1b'");  // already escaped: unchanged
  EXPECT_EQ(printable("a\x1b[2Jb\nc\x7f"), "a\\x1b[2Jb\\x0ac\\x7f");
  EXPECT_EQ(printable("caf\xc3\xa9"), "caf\xc3\xa9");  // UTF-8 kept
  EXPECT_EQ(printable("x\xc2\x9b"
                      "2J"),
            "x\\xc2\\x9b2J");  // C1 CSI in UTF-8 escaped
  EXPECT_EQ(printable("abcdef", 4), "abcd...");
}

}  // namespace
}  // namespace ringattn
