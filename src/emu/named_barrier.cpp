// Named barriers and setmaxnreg (see named_barrier.hpp).
#include "emu/named_barrier.hpp"

#include <string>

#include "emu/block_runner.hpp"
#include "emu/dim3.hpp"

namespace ringattn::emu {
namespace {

std::string at(std::source_location where) { return " (at " + describe(where) + ")"; }

// Arrives at barrier `id`; returns the generation arrived in, and whether it ended it.
std::pair<std::uint64_t, bool> arrive(unsigned id, unsigned count, const char* call,
                                      std::source_location where) {
  BlockRunner& block = current_block();
  const auto threads = static_cast<unsigned>(volume(block.config().block));
  if (id == 0 || id > 15) {
    fault_here(std::string(call) + " " + std::to_string(id) +
               ": named barriers are 1 to 15 (0 is __syncthreads())" + at(where));
  }
  if (count == 0 || count % 32 != 0 || count > threads) {
    fault_here(std::string(call) + " " + std::to_string(id) + ", " + std::to_string(count) +
               ": the count must be a positive multiple of 32, at most the block's " +
               std::to_string(threads) + " threads" + at(where));
  }
  NamedBarrier& b = block.named_barrier(id);
  if (b.arrived > 0 && b.expected != count) {
    fault_here(std::string(call) + " " + std::to_string(id) + " with count " +
               std::to_string(count) + ", while " + std::to_string(b.arrived) +
               " threads arrived expecting " + std::to_string(b.expected) + at(where));
  }
  b.expected = count;
  const std::uint64_t generation = b.generation;
  if (++b.arrived < count) return {generation, false};
  b.arrived = 0;
  ++b.generation;
  return {generation, true};
}

class SetmaxnregOp final : public WarpOp {
 public:
  SetmaxnregOp(bool increase, unsigned count) : increase_(increase), count_(count) {}
  std::string_view name() const override {
    return increase_ ? "setmaxnreg.inc.sync.aligned.u32" : "setmaxnreg.dec.sync.aligned.u32";
  }
  void perform(const WarpLanes& lanes) override {
    for (unsigned l = 0; l < kWarpSize; ++l) {
      if (lane_op<SetmaxnregOp>(lanes, l).count_ != count_) {
        fault_at(*lanes.thread[l], std::string(name()) + ": lanes of one warp ask for " +
                                       std::to_string(count_) + " and " +
                                       std::to_string(lane_op<SetmaxnregOp>(lanes, l).count_) +
                                       " registers");
      }
    }
  }

 private:
  bool increase_;
  unsigned count_;
};

}  // namespace

void named_barrier_sync(unsigned id, unsigned count, std::source_location where) {
  const auto [generation, ended] = arrive(id, count, "bar.sync", where);
  if (!ended) wait_at_named_barrier(id, generation, where);
}

void named_barrier_arrive(unsigned id, unsigned count, std::source_location where) {
  const auto [generation, ended] = arrive(id, count, "bar.arrive", where);
  if (ended) yield_after_named_arrive(id, generation, where);
}

void setmaxnreg(bool increase, unsigned count, std::source_location where) {
  if (count < 24 || count > 256 || count % 8 != 0) {
    fault_here(std::string(increase ? "setmaxnreg.inc" : "setmaxnreg.dec") + " " +
               std::to_string(count) + ": the count must be a multiple of 8 in 24..256" +
               at(where));
  }
  SetmaxnregOp op(increase, count);
  arrive_at_warp_op(op, 0, true, where);
}

}  // namespace ringattn::emu
