// What every fuzz target checks besides "no crash": a failed invariant prints what broke
// and aborts, which libFuzzer reports as a finding and saves the input that caused it.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "ringattn/errors.hpp"
#include "ringattn/quote.hpp"

namespace ringattn::fuzz {

[[noreturn]] inline void fail(const char* what, std::string_view detail = {}) {
  std::fprintf(stderr, "fuzz invariant broken: %s: %s\n", what, escaped(detail, 400).c_str());
  std::abort();
}

inline void check(bool ok, const char* what, std::string_view detail = {}) {
  if (!ok) fail(what, detail);
}

enum class Text {
  ascii,     // every input byte went through quote()/escaped(): printable ASCII only
  printable  // a library's message went through printable(): no terminal controls, UTF-8 kept
};

// An error message may hold bytes from the input only escaped, so printing it cannot move a
// cursor, clear a screen or retitle a window. Each quoted field is capped, so the message
// stays short however long the input.
inline void check_message(std::string_view message, Text text = Text::ascii,
                          std::size_t max_bytes = 1024) {
  check(!message.empty(), "empty error message");
  check(message.size() <= max_bytes, "error message longer than expected", message.substr(0, 200));
  if (text == Text::printable) {
    check(printable(message) == message, "terminal control in error message", message);
    return;
  }
  for (const char ch : message) {
    const auto c = static_cast<unsigned char>(ch);
    check(c >= 0x20 && c < 0x7f, "unescaped byte in error message", message);
  }
}

// An InputError names its subject and says what is wrong; both parts are printable.
inline void check_input_error(const InputError& e, std::string_view expected_subject = {},
                              Text text = Text::ascii) {
  check_message(e.what(), text);
  check(!e.problem().empty(), "InputError without a problem", e.what());
  if (!expected_subject.empty())
    check(e.subject() == expected_subject, "InputError names the wrong subject", e.what());
}

}  // namespace ringattn::fuzz
