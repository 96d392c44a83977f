// Escaping and capping of untrusted text for error messages (see core/quote.hpp).
#include "ringattn/quote.hpp"

#include <string>
#include <string_view>

namespace ringattn {

namespace {

void append_hex_escape(std::string& out, unsigned char c) {
  constexpr char kHex[] = "0123456789abcdef";
  out += "\\x";
  out += kHex[c >> 4];
  out += kHex[c & 0xf];
}

// Appends `text` with escapes for everything outside printable ASCII, the backslash, and
// `delimiter` (none when it is '\0').
void append_escaped(std::string& out, std::string_view text, char delimiter) {
  for (const char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if (ch == '\n') {
      out += "\\n";
    } else if (ch == '\r') {
      out += "\\r";
    } else if (ch == '\t') {
      out += "\\t";
    } else if (ch == '\\' || (delimiter != '\0' && ch == delimiter)) {
      out += '\\';
      out += ch;
    } else if (c < 0x20 || c >= 0x7f) {
      append_hex_escape(out, c);
    } else {
      out += ch;
    }
  }
}

}  // namespace

std::string escaped(std::string_view text, std::size_t max_bytes) {
  const bool cut = text.size() > max_bytes;
  std::string out;
  append_escaped(out, text.substr(0, max_bytes), '\0');
  if (cut) out += "...";
  return out;
}

std::string quote(std::string_view text, std::size_t max_bytes) {
  const bool cut = text.size() > max_bytes;
  text = text.substr(0, max_bytes);
  // As Python's repr: double quotes when that saves escaping single ones.
  const char delimiter =
      text.find('\'') != std::string_view::npos && text.find('"') == std::string_view::npos ? '"'
                                                                                            : '\'';
  std::string out(1, delimiter);
  append_escaped(out, text, delimiter);
  out += delimiter;
  if (cut) out += "...";
  return out;
}

std::string printable(std::string_view message, std::size_t max_bytes) {
  const bool cut = message.size() > max_bytes;
  if (cut) message = message.substr(0, max_bytes);
  std::string out;
  out.reserve(message.size());
  for (std::size_t i = 0; i < message.size(); ++i) {
    const auto c = static_cast<unsigned char>(message[i]);
    const unsigned char next =
        i + 1 < message.size() ? static_cast<unsigned char>(message[i + 1]) : '\0';
    if (c < 0x20 || c == 0x7f) {
      append_hex_escape(out, c);
    } else if (c == 0xc2 && next >= 0x80 && next <= 0x9f) {
      // A C1 control in UTF-8 (U+0080..U+009F; U+009B is CSI to some terminals).
      append_hex_escape(out, c);
      append_hex_escape(out, next);
      ++i;
    } else {
      out += static_cast<char>(c);
    }
  }
  if (cut) out += "...";
  return out;
}

}  // namespace ringattn
