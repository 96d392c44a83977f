// The library's words for JobSpec fields in messages, and finding them again (see
// ringattn/field_words.hpp).
#include "ringattn/field_words.hpp"

#include <string>
#include <string_view>

namespace ringattn {

namespace {

struct FieldName {
  std::string_view path;
  bool prose = false;  // also a word of prose: a mention only with a value
};

// Every JobSpec member a message may name, as C++ code reaches it from the JobSpec.
constexpr FieldName kFields[] = {
    {"config.shape.batch"},
    {"config.shape.seq_len"},
    {"config.shape.heads"},
    {"config.shape.head_dim"},
    {"config.kv_heads"},
    {"config.head_dim_v"},
    {"config.softcap"},
    {"config.attention"},
    {"config.combine"},
    {"config.segments"},
    {"config.dilations"},
    {"config.causal"},
    {"config.scale"},
    {"config.window_left"},
    {"config.window_right"},
    {"config.cu_seqlens"},
    {"config.block_size"},
    {"config.layout"},
    {"config.kv_layout"},
    {"attention_auto"},
    {"sparse_threshold"},
    {"block_sparse.pattern"},
    {"block_sparse.mask"},
    {"block_sparse.seed"},
    {"device_index"},
    {"timeout_s"},
    {"ulysses"},
    {"device", true},
    {"dtype", true},
    {"kernel", true},
    {"transport", true},
    {"threads", true},
    {"sinks", true},
    {"deterministic", true},
};

bool alnum(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}
bool word_char(char c) { return alnum(c) || c == '_'; }

// Where the quoted text opening at `i` ends (one past its closing quote), or npos when it
// does not close. Escapes are quote()'s: a backslash and the next byte.
std::size_t quoted_end(std::string_view text, std::size_t i) {
  const char q = text[i];
  for (std::size_t j = i + 1; j < text.size(); ++j) {
    if (text[j] == '\\')
      ++j;
    else if (text[j] == q)
      return j + 1;
  }
  return std::string_view::npos;
}

bool opens_quote(std::string_view text, std::size_t i) {
  return (text[i] == '\'' || text[i] == '"') && (i == 0 || !alnum(text[i - 1]));
}

// The value after '=' at `i`: a quoted text, or a run of letters, digits, '_', '+', '-' and
// '.' between two of them. Empty where there is none.
std::string_view value_at(std::string_view text, std::size_t i) {
  if (i >= text.size()) return {};
  if (text[i] == '\'' || text[i] == '"') {
    const std::size_t end = quoted_end(text, i);
    return end == std::string_view::npos ? std::string_view{} : text.substr(i, end - i);
  }
  std::size_t j = i;
  while (j < text.size() &&
         (word_char(text[j]) || text[j] == '+' || text[j] == '-' ||
          (text[j] == '.' && j > i && j + 1 < text.size() && alnum(text[j + 1]))))
    ++j;
  return text.substr(i, j - i);
}

// The longest field whose path starts at `i` and ends at a word's end, or null.
const FieldName* field_at(std::string_view text, std::size_t i) {
  const FieldName* found = nullptr;
  for (const FieldName& f : kFields) {
    if (text.substr(i, f.path.size()) != f.path) continue;
    const std::size_t k = i + f.path.size();
    const bool ends =
        k == text.size() ||
        (!word_char(text[k]) && !(text[k] == '.' && k + 1 < text.size() && alnum(text[k + 1])));
    if (ends && (!found || f.path.size() > found->path.size())) found = &f;
  }
  return found;
}

}  // namespace

std::string field_is(std::string_view field, std::string_view value) {
  std::string s(field);
  s += '=';
  s += value;
  return s;
}

std::string reword_fields(
    std::string_view text,
    const std::function<std::optional<std::string>(std::string_view field,
                                                   std::optional<std::string_view> value)>& say) {
  std::string out;
  out.reserve(text.size());
  std::size_t i = 0;
  while (i < text.size()) {
    if (opens_quote(text, i)) {
      const std::size_t end = quoted_end(text, i);
      if (end != std::string_view::npos) {
        out += text.substr(i, end - i);
        i = end;
        continue;
      }
    }
    const char before = i == 0 ? ' ' : text[i - 1];
    if (!word_char(before) && before != '.' && before != '-') {
      if (const FieldName* f = field_at(text, i)) {
        const std::size_t k = i + f->path.size();
        const bool has_value = k < text.size() && text[k] == '=';
        const std::string_view value = has_value ? value_at(text, k + 1) : std::string_view{};
        if (has_value ? !value.empty() : !f->prose) {
          const std::size_t end = has_value ? k + 1 + value.size() : k;
          const auto said = say(f->path, has_value ? std::optional(value) : std::nullopt);
          out += said ? std::string_view(*said) : text.substr(i, end - i);
          i = end;
          continue;
        }
      }
    }
    out += text[i++];
  }
  return out;
}

}  // namespace ringattn
