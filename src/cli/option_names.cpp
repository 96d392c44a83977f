// JobSpec field -> CLI option (option_names.hpp).
#include "cli/option_names.hpp"

#include <string_view>
#include <utility>

#include "ringattn/errors.hpp"

namespace ringattn::cli {

std::string option_of(const std::string& subject) {
  static constexpr std::pair<std::string_view, std::string_view> kOptions[] = {
      {"config.shape.batch", "--batch"},
      {"config.shape.seq_len", "--seq-len"},
      {"config.shape.heads", "--heads"},
      {"config.shape.head_dim", "--head-dim"},
      {"config.kv_heads", "--kv-heads"},
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
  };
  for (const auto& [field, option] : kOptions)
    if (subject == field) return std::string(option);
  return subject;
}

std::string cli_message(const std::exception& e) {
  if (const auto* input = dynamic_cast<const InputError*>(&e))
    return option_of(input->subject()) + ": " + input->problem();
  return e.what();
}

}  // namespace ringattn::cli
