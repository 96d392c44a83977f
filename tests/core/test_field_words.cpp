// field_is() and reword_fields(): the words the library's messages name JobSpec fields in, and
// which of them a front end finds again (a field with a value, a bare path that is no word of
// prose) and which it must leave alone (other words, env settings, quoted input).
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <string_view>

#include "ringattn/field_words.hpp"

namespace ringattn {
namespace {

// Each field word found, marked as <field|value> (or <field> when bare).
std::string marked(std::string_view text) {
  return reword_fields(text, [](std::string_view field, std::optional<std::string_view> value) {
    return std::optional("<" + std::string(field) + (value ? "|" + std::string(*value) : "") + ">");
  });
}

TEST(FieldWords, FieldIsWritesFieldEqualsValue) {
  EXPECT_EQ(field_is("kernel", "auto"), "kernel=auto");
  EXPECT_EQ(field_is("config.attention", std::string("block-sparse")),
            "config.attention=block-sparse");
  EXPECT_EQ(field_is("deterministic", true), "deterministic=true");
  EXPECT_EQ(field_is("sinks", false), "sinks=false");
}

TEST(FieldWords, FieldsWithValuesAreFound) {
  EXPECT_EQ(marked("kernel=auto: the native kernels"), "<kernel|auto>: the native kernels");
  EXPECT_EQ(marked("(use device=cpu or auto)"), "(use <device|cpu> or auto)");
  EXPECT_EQ(marked("use kernel=native, hopper or auto."), "use <kernel|native>, hopper or auto.");
  EXPECT_EQ(marked("only applies to config.attention=block-sparse"),
            "only applies to <config.attention|block-sparse>");
  EXPECT_EQ(marked("N = 5 > sparse_threshold=4: block-sparse"),
            "N = 5 > <sparse_threshold|4>: block-sparse");
  EXPECT_EQ(marked("timeout_s=2.5 s"), "<timeout_s|2.5> s");
  EXPECT_EQ(marked("(config.kv_heads=2 != config.shape.heads=4)"),
            "(<config.kv_heads|2> != <config.shape.heads|4>)");
  EXPECT_EQ(marked("(block_sparse.pattern='a b' has none)"),
            "(<block_sparse.pattern|'a b'> has none)");
}

TEST(FieldWords, BarePathsAreFoundUnlessTheyAreWordsOfProse) {
  EXPECT_EQ(marked("(config.shape.seq_len)"), "(<config.shape.seq_len>)");
  EXPECT_EQ(marked("a smaller config.shape.seq_len/config.shape.batch."),
            "a smaller <config.shape.seq_len>/<config.shape.batch>.");
  EXPECT_EQ(marked("within 2 s (timeout_s): its group"), "within 2 s (<timeout_s>): its group");
  EXPECT_EQ(marked("choose ulysses so"), "choose <ulysses> so");
  EXPECT_EQ(marked("the device runs a kernel with sinks deterministic threads dtype transport"),
            "the device runs a kernel with sinks deterministic threads dtype transport");
}

TEST(FieldWords, OtherWordsAreLeftAlone) {
  // Not at a word's start, not at its end, a different word, no value.
  for (const char* s :
       {"--kernel auto", "x.kernel=auto", "my_kernel=auto", "kernels=auto", "config.shape.heads_x",
        "config.segmentsx", "segments=a/b,dilations=x/y", "RINGATTN_HOPPER_BWD=fused",
        "kernel= auto", "config.shape", "N = 4", "timeout_s.x"})
    EXPECT_EQ(marked(s), s);
}

TEST(FieldWords, QuotedTextIsLeftAlone) {
  EXPECT_EQ(marked("unknown value 'kernel=auto' for device=cpu"),
            "unknown value 'kernel=auto' for <device|cpu>");
  EXPECT_EQ(marked("\"timeout_s\" and timeout_s"), "\"timeout_s\" and <timeout_s>");
  EXPECT_EQ(marked("'it\\'s kernel=x' kernel=y"), "'it\\'s kernel=x' <kernel|y>");
  // An apostrophe inside a word opens nothing.
  EXPECT_EQ(marked("cuDNN's kernel=cudnn ring's"), "cuDNN's <kernel|cudnn> ring's");
  // A quote that never closes is text like any other.
  EXPECT_EQ(marked("'open kernel=auto"), "'open <kernel|auto>");
}

TEST(FieldWords, SayingNothingKeepsTheLibrarysWords) {
  const auto keep_kernel = [](std::string_view field, std::optional<std::string_view>) {
    return field == "kernel" ? std::nullopt : std::optional<std::string>("X");
  };
  EXPECT_EQ(reword_fields("kernel=auto, device=cpu", keep_kernel), "kernel=auto, X");
}

}  // namespace
}  // namespace ringattn
