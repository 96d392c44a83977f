// A warp collective as the block runner sees it. Each lane that reaches one suspends with
// its own WarpOp (its inputs and room for its outputs, on its own stack); once every lane of
// the mask waits at a matching op, the runner calls perform() once with all of them.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace ringattn::emu {

struct ThreadState;
class WarpOp;

inline constexpr unsigned kWarpSize = 32;

// The lanes taking part: op[l] and thread[l] are null for lanes outside the mask.
struct WarpLanes {
  std::uint32_t mask = 0;
  std::array<WarpOp*, kWarpSize> op{};
  std::array<const ThreadState*, kWarpSize> thread{};
};

class WarpOp {
 public:
  virtual ~WarpOp() = default;
  // The CUDA or PTX name, for matching lanes and for messages.
  virtual std::string_view name() const = 0;
  // Whether `other` (another lane's op) is the same collective; name() by default.
  virtual bool matches(const WarpOp& other) const { return name() == other.name(); }
  // Computes every lane's results; may fault naming a lane (fault_at(*lanes.thread[l], ...)).
  virtual void perform(const WarpLanes& lanes) = 0;

 protected:
  WarpOp() = default;
  WarpOp(const WarpOp&) = default;
  WarpOp& operator=(const WarpOp&) = default;
};

// Downcasts lane `l`'s op once perform() has been called on a matching op.
template <typename Op>
Op& lane_op(const WarpLanes& lanes, unsigned l) {
  return static_cast<Op&>(*lanes.op[l]);
}

}  // namespace ringattn::emu
