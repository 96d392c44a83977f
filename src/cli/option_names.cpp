// JobSpec field -> CLI option, in subjects and in texts (option_names.hpp).
#include "cli/option_names.hpp"

#include <optional>
#include <string_view>
#include <utility>

#include "ringattn/errors.hpp"
#include "ringattn/field_words.hpp"

namespace ringattn::cli {

std::string option_of(const std::string& subject) {
  static constexpr std::pair<std::string_view, std::string_view> kOptions[] = {
      {"config.shape.batch", "--batch"},
      {"config.shape.seq_len", "--seq-len"},
      {"config.shape.heads", "--heads"},
      {"config.shape.head_dim", "--head-dim"},
      {"config.kv_heads", "--kv-heads"},
      {"config.head_dim_v", "--head-dim-v"},
      {"config.softcap", "--softcap"},
      {"config.attention", "--attention"},
      {"config.combine", "--combine"},
      {"config.segments", "--segments"},
      {"config.dilations", "--dilations"},
      {"config.causal", "--causal"},
      {"config.scale", "--scale"},
      {"config.window_left", "--window"},
      {"config.window_right", "--window"},
      {"config.cu_seqlens", "--seqlens"},
      {"config.block_size", "--block-size"},
      {"config.layout", "--layout"},
      {"config.kv_layout", "--kv-layout"},
      {"attention_auto", "--attention auto"},
      {"block_sparse.pattern", "--pattern"},
      {"block_sparse.mask", "--block-mask"},
      {"sparse_threshold", "--sparse-threshold"},
      {"device", "--device"},
      {"dtype", "--dtype"},
      {"kernel", "--kernel"},
      {"transport", "--comm"},
      {"threads", "--threads"},
      {"timeout_s", "--timeout"},
      {"ulysses", "--ulysses"},
      {"sinks", "--sinks"},
      {"deterministic", "--deterministic"},
  };
  for (const auto& [field, option] : kOptions)
    if (subject == field) return std::string(option);
  return subject;
}

namespace {

// One field word as the CLI says it: the option, with the value after it; a boolean's option
// alone, or "no" before it. None where no option sets the field: the library's words stay.
std::optional<std::string> option_saying(std::string_view field,
                                         std::optional<std::string_view> value) {
  std::string option = option_of(std::string(field));
  if (option == field) return std::nullopt;
  if (!value || *value == "true") return option;
  if (*value == "false") return "no " + option;
  return option + " " + std::string(*value);
}

}  // namespace

std::string option_words(std::string_view text) { return reword_fields(text, option_saying); }

std::string cli_message(const std::exception& e) {
  if (const auto* input = dynamic_cast<const InputError*>(&e))
    return option_of(input->subject()) + ": " + option_words(input->problem());
  return option_words(e.what());
}

}  // namespace ringattn::cli
