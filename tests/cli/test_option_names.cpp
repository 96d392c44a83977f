// The CLI's edge (label `cli`): the library's texts, which name JobSpec fields in its own words
// ("kernel=auto", "config.shape.heads"), read exactly as the CLI has always printed them
// ("--kernel auto", "--heads"); the CLI's own texts and what a user typed pass unchanged.
#include <gtest/gtest.h>

#include <string>
#include <utility>

#include "cli/option_names.hpp"
#include "ringattn/errors.hpp"

namespace ringattn::cli {
namespace {

// Notes and messages as the library writes them, and as the CLI prints them.
const std::pair<const char*, const char*> kTexts[] = {
    {"kernel=auto: the sm_90a forward and backward (TMA + wgmma) stand in for the native kernels "
     "wherever cuDNN does not run or is slower",
     "--kernel auto: the sm_90a forward and backward (TMA + wgmma) stand in for the native "
     "kernels wherever cuDNN does not run or is slower"},
    {"kernel=hopper: a shard of 5 rows (tensor map coordinates are int); using the native kernels",
     "--kernel hopper: a shard of 5 rows (tensor map coordinates are int); using the native "
     "kernels"},
    {"kernel=cudnn: cuDNN cannot run ring step 0 of 2 (x); using the native kernels",
     "--kernel cudnn: cuDNN cannot run ring step 0 of 2 (x); using the native kernels"},
    {"kernel=auto: ring forward hopper 2.000 ms, cudnn 1.000 ms (median of 5, slowest rank); "
     "using cudnn",
     "--kernel auto: ring forward hopper 2.000 ms, cudnn 1.000 ms (median of 5, slowest rank); "
     "using cudnn"},
    {"kernel=auto leaves out cuDNN's forward: no committed GPU log shows it passing yet "
     "(kernel=cudnn runs it anyway; docs/GPU_PERFORMANCE.md)",
     "--kernel auto leaves out cuDNN's forward: no committed GPU log shows it passing yet "
     "(--kernel cudnn runs it anyway; docs/GPU_PERFORMANCE.md)"},
    {"kernel=auto leaves out the sm_90a backward's fused kernel: no committed GPU log shows it "
     "passing yet (RINGATTN_HOPPER_BWD=fused runs it anyway; docs/GPU_PERFORMANCE.md)",
     "--kernel auto leaves out the sm_90a backward's fused kernel: no committed GPU log shows it "
     "passing yet (RINGATTN_HOPPER_BWD=fused runs it anyway; docs/GPU_PERFORMANCE.md)"},
    {"cuDNN 9 SDPA, graphs built in 12 ms; the backward runs natively (deterministic=true: "
     "cuDNN's backward adds dQ with atomics)",
     "cuDNN 9 SDPA, graphs built in 12 ms; the backward runs natively (--deterministic: cuDNN's "
     "backward adds dQ with atomics)"},
    {"attention_auto=true: N = 2048 > sparse_threshold=1023: block-sparse",
     "--attention auto: N = 2048 > --sparse-threshold 1023: block-sparse"},
    {"attention_auto=true: N = 512 <= sparse_threshold=1024: dilated",
     "--attention auto: N = 512 <= --sparse-threshold 1024: dilated"},
    {"auto: N = 100 is above sparse_threshold=64, where block-sparse runs the dilated-blocks "
     "pattern; give config.segments and config.dilations for it",
     "auto: N = 100 is above --sparse-threshold 64, where block-sparse runs the dilated-blocks "
     "pattern; give --segments and --dilations for it"},
    {"'cuda' is not available: this build of ringattn has CPU kernels only (use device=cpu or "
     "auto)",
     "'cuda' is not available: this build of ringattn has CPU kernels only (use --device cpu or "
     "auto)"},
    {"'cuda' is a CUDA kernel, but this run uses the CPU (device=auto); use device=cuda",
     "'cuda' is a CUDA kernel, but this run uses the CPU (--device auto); use --device cuda"},
    {"'mpi' moves host memory, and the GPU engines exchange device memory (NCCL, or device copies "
     "between virtual ranks); use transport=nccl or auto, or device=cpu",
     "'mpi' moves host memory, and the GPU engines exchange device memory (NCCL, or device copies "
     "between virtual ranks); use --comm nccl or auto, or --device cpu"},
    {"'cudnn' has no block-sparse kernel; use kernel=native or auto",
     "'cudnn' has no block-sparse kernel; use --kernel native or auto"},
    {"attention sinks join one softmax per row, and attention_auto=true (dilated at this N) has "
     "one per pattern: use dense or block-sparse attention (config.attention), or sinks=false",
     "attention sinks join one softmax per row, and --attention auto (dilated at this N) has one "
     "per pattern: use dense or block-sparse attention (--attention), or no --sinks"},
    {"only applies to config.attention=block-sparse", "only applies to --attention block-sparse"},
    {"with config.causal=true a query sees no later key: the right reach must be 0 or omitted, "
     "got 2",
     "with --causal a query sees no later key: the right reach must be 0 or omitted, got 2"},
    {"4 K/V heads cannot be shared by 6 query heads (config.shape.heads): config.kv_heads must "
     "divide config.shape.heads",
     "4 K/V heads cannot be shared by 6 query heads (--heads): --kv-heads must divide --heads"},
    {"grouped-query attention (config.kv_heads=2 != config.shape.heads=4) is not yet supported on "
     "device=cuda (use device=cpu)",
     "grouped-query attention (--kv-heads 2 != --heads 4) is not yet supported on --device cuda "
     "(use --device cpu)"},
    {"3 segment lengths but 2 dilations (config.dilations); they must pair up",
     "3 segment lengths but 2 dilations (--dilations); they must pair up"},
    {"6 heads cannot be split into 8 groups (one per segment); use at least as many heads as "
     "segments, or config.combine=mixture",
     "6 heads cannot be split into 8 groups (one per segment); use at least as many heads as "
     "segments, or --combine mixture"},
    {"the document lengths sum to 5, not to the sequence length 6 (config.shape.seq_len)",
     "the document lengths sum to 5, not to the sequence length 6 (--seq-len)"},
    {"packed sequences do not combine with config.attention=dilated yet (use dense attention)",
     "packed sequences do not combine with --attention dilated yet (use dense attention)"},
    {"only used by the dilated-blocks pattern (block_sparse.pattern='local' has none)",
     "only used by the dilated-blocks pattern (--pattern 'local' has none)"},
    {"'dilated-blocks' needs segments and dilations (config.segments and config.dilations, or "
     "segments=a/b,dilations=x/y)",
     "'dilated-blocks' needs segments and dilations (--segments and --dilations, or "
     "segments=a/b,dilations=x/y)"},
    {"block mask shape [3, 3] does not match ... expected [2, 4, 4] or [4, 4] (see "
     "config.block_size)",
     "block mask shape [3, 3] does not match ... expected [2, 4, 4] or [4, 4] (see --block-size)"},
    {"out of memory; use more ranks or a smaller "
     "config.shape.seq_len/config.shape.batch/config.shape.heads",
     "out of memory; use more ranks or a smaller --seq-len/--batch/--heads"},
    {"ring step 1 (forward K/V) did not complete within 2 s (timeout_s): receiving 64 bytes from "
     "rank 1",
     "ring step 1 (forward K/V) did not complete within 2 s (--timeout): receiving 64 bytes from "
     "rank 1"},
    {"each of the 2 groups holds 6 rows, which its 4 ranks cannot split evenly; choose "
     "config.shape.seq_len or ulysses so that they do",
     "each of the 2 groups holds 6 rows, which its 4 ranks cannot split evenly; choose --seq-len "
     "or --ulysses so that they do"},
    {"'cudnn' has no block-sparse kernels: the GPU block-sparse mode runs kernel=native, hopper or "
     "auto",
     "'cudnn' has no block-sparse kernels: the GPU block-sparse mode runs --kernel native, hopper "
     "or auto"},
};

TEST(OptionWords, LibraryTextsReadAsTheCliHasAlwaysPrintedThem) {
  for (const auto& [library, cli] : kTexts) EXPECT_EQ(option_words(library), cli);
}

TEST(OptionWords, TheCliAndTheUserWordsPassUnchanged) {
  for (const auto& [library, cli] : kTexts) EXPECT_EQ(option_words(cli), cli);
  for (const char* s :
       {"the argument ('kernel=auto') for option '--kernel' is invalid",
        "--q (q.npy): shape [1, 2, 3, 4] differs from --q's [1, 2, 3, 5]",
        "the device, the kernel, the sinks, deterministic threads", "dtype 'kernel=x'"})
    EXPECT_EQ(option_words(s), s);
}

TEST(OptionWords, FieldsNoOptionSetsKeepTheLibrarysWords) {
  EXPECT_EQ(option_words("device_index=3 and block_sparse.seed=7"),
            "device_index=3 and block_sparse.seed=7");
}

TEST(OptionWords, CliMessageTranslatesSubjectAndText) {
  EXPECT_EQ(cli_message(InputError("config.segments",
                                   "3 segment lengths but 2 dilations (config.dilations)")),
            "--segments: 3 segment lengths but 2 dilations (--dilations)");
  EXPECT_EQ(cli_message(RuntimeFailure("barrier did not complete within 0.3 s (timeout_s)")),
            "barrier did not complete within 0.3 s (--timeout)");
  EXPECT_EQ(option_of("attention_auto"), "--attention auto");
  EXPECT_EQ(option_of("deterministic"), "--deterministic");
}

}  // namespace
}  // namespace ringattn::cli
