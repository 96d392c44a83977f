// Launch: check the configuration as CUDA would, then run the blocks in the mode's order.
#include "emu/launch.hpp"

#include <cstdint>

#include "emu/block_runner.hpp"
#include "emu/fault.hpp"

namespace ringattn::emu {

void launch(const LaunchConfig& config, const std::function<void()>& body) {
  const auto refuse = [&](const std::string& why) {
    return EmuUsageError("launch of emulated kernel '" + config.kernel + "' (grid " +
                         to_string(config.grid) + ", block " + to_string(config.block) +
                         "): " + why);
  };
  const std::uint64_t threads = volume(config.block), blocks = volume(config.grid);
  if (threads == 0 || blocks == 0) throw refuse("a zero extent");
  if (threads > 1024) throw refuse("more than 1024 threads per block");
  if (config.block.z > 64) throw refuse("block z above 64");
  if (config.grid.y > 65535 || config.grid.z > 65535) throw refuse("grid y or z above 65535");
  if (blocks > UINT32_MAX) throw refuse("more blocks than the emulator runs in one launch");

  const ExecutionMode mode = execution_mode();
  StackPool stacks;
  BlockRunner runner(config, mode, stacks);
  LaunchWrites writes(config.global, config.grid);
  const detail::ScopedLaunchWrites scoped(&writes);
  for (const unsigned b : run_order(mode, static_cast<unsigned>(blocks), 0x626c6f636bull)) {
    writes.begin_block(b);
    runner.run(unlinear(b, config.grid), b, body);
  }
}

}  // namespace ringattn::emu
