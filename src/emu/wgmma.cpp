// wgmma on the CPU (see wgmma.hpp): descriptors decoded into arena addresses, the warp's 16
// rows of the 64 × N product computed at the issue or at the covering wait_group.
#include "emu/wgmma.hpp"

#include <array>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "emu/block_runner.hpp"
#include "emu/fragment_layouts.hpp"
#include "emu/numeric_formats.hpp"
#include "emu/tma.hpp"

namespace ringattn::emu {
namespace {

std::string at(std::source_location where) { return " (at " + describe(where) + ")"; }

std::uint32_t width_of(GmmaSwizzle s) {
  switch (s) {
    case GmmaSwizzle::bytes128:
      return 128;
    case GmmaSwizzle::bytes64:
      return 64;
    case GmmaSwizzle::bytes32:
      return 32;
    case GmmaSwizzle::none:
      break;
  }
  return 0;
}

TmaSwizzle tma_of(GmmaSwizzle s) {
  switch (s) {
    case GmmaSwizzle::bytes128:
      return TmaSwizzle::bytes128;
    case GmmaSwizzle::bytes64:
      return TmaSwizzle::bytes64;
    case GmmaSwizzle::bytes32:
      return TmaSwizzle::bytes32;
    case GmmaSwizzle::none:
      break;
  }
  return TmaSwizzle::none;
}

const char* name_of(TmaSwizzle s) {
  switch (s) {
    case TmaSwizzle::bytes128:
      return "128-byte";
    case TmaSwizzle::bytes64:
      return "64-byte";
    case TmaSwizzle::bytes32:
      return "32-byte";
    case TmaSwizzle::none:
      break;
  }
  return "no";
}

// Element (row, k) through `desc` (row: the M or N index), for thread `t`'s fault messages;
// checks the arena and the swizzle of the unit against the tensor copy that wrote it.
std::uint32_t element_address(std::uint64_t desc, std::uint32_t row, std::uint32_t k,
                              const ThreadState& t, bool mn_major) {
  const std::uint32_t start = static_cast<std::uint32_t>(desc & 0x3fff) << 4;
  const std::uint32_t lbo = static_cast<std::uint32_t>((desc >> 16) & 0x3fff) << 4;
  const std::uint32_t sbo = static_cast<std::uint32_t>((desc >> 32) & 0x3fff) << 4;
  const auto base = static_cast<unsigned>((desc >> 49) & 7);
  const auto swizzle = static_cast<GmmaSwizzle>((desc >> 62) & 3);
  if (base != 0) {
    fault_at(t, "a wgmma descriptor with base offset " + std::to_string(base) +
                    " (the emulator reads atoms that start on their first swizzle row only)");
  }
  std::uint32_t addr = 0;
  if (mn_major) {
    // 16-byte units of 8 consecutive M|N elements; k rows of them (PTX's transposed
    // canonical layouts): without swizzle, units along M|N at SBO and k-groups of 8 at LBO;
    // swizzled, W bytes of M|N per row, repeats along M|N at LBO, k-groups at SBO.
    if (swizzle == GmmaSwizzle::none) {
      addr = start + (row / 8) * sbo + (k / 8) * lbo + (k % 8) * 16 + (row % 8) * 2;
    } else {
      const std::uint32_t w = width_of(swizzle), per_row = w / 2;
      if (start % (8 * w) >= w) {
        fault_at(t, "a wgmma descriptor with a " + std::string(name_of(tma_of(swizzle))) +
                        " swizzle starts at shared offset " + std::to_string(start) +
                        ", not on the first row of its " + std::to_string(8 * w) + "-byte atom");
      }
      addr = tma_swizzled_offset(tma_of(swizzle), start + (row / per_row) * lbo + (k / 8) * sbo +
                                                      (k % 8) * w + (row % per_row) * 2);
    }
  } else if (swizzle == GmmaSwizzle::none) {
    addr = start + (row / 8) * sbo + (k / 8) * lbo + (row % 8) * 16 + (k % 8) * 2;
  } else {
    const std::uint32_t w = width_of(swizzle);
    if (start % (8 * w) >= w) {
      fault_at(t, "a wgmma descriptor with a " + std::string(name_of(tma_of(swizzle))) +
                      " swizzle starts at shared offset " + std::to_string(start) +
                      ", not on the first row of its " + std::to_string(8 * w) + "-byte atom");
    }
    addr = tma_swizzled_offset(tma_of(swizzle), start + (row / 8) * sbo + (row % 8) * w + 2 * k);
  }
  BlockRunner& block = current_block();
  if (!block.arena().contains(addr, 2)) {
    fault_at(t, "a wgmma descriptor reads shared offset " + std::to_string(addr) +
                    " (row " + std::to_string(row) + ", k " + std::to_string(k) + "), outside the " +
                    std::to_string(block.arena().size()) + "-byte arena");
  }
  const std::uint8_t written = block.unit_swizzle()[addr / 16];
  if (written == kUnitInFlight) {
    fault_at(t, "a wgmma reads shared offset " + std::to_string(addr) +
                    ", where an asynchronous copy has not landed (wait on its mbarrier first)");
  }
  if (const ThreadState* g = block.unfenced_generic_access(addr)) {
    fault_at(t, "a wgmma reads shared offset " + std::to_string(addr) + ", where " +
                    describe_generic_access(*g));
  }
  if (written != 0 && written != 1 + static_cast<int>(tma_of(swizzle))) {
    fault_at(t, "a wgmma descriptor with " + std::string(name_of(tma_of(swizzle))) +
                    " swizzle reads shared offset " + std::to_string(addr) +
                    ", which a tensor copy wrote with " +
                    name_of(static_cast<TmaSwizzle>(written - 1)) + " swizzle");
  }
  return addr;
}

class WgmmaCompute final : public PendingAsync {
 public:
  MmaInput input = MmaInput::bf16;
  unsigned n = 0, warp_in_group = 0;
  bool scale_d = true, a_from_registers = false, a_mn_major = false, b_mn_major = false;
  std::uint64_t desc_a = 0, desc_b = 0;
  std::array<std::array<std::uint32_t, 4>, kWarpSize> a{};
  std::array<float*, kWarpSize> d{};
  const ThreadState* issuer = nullptr;

  void land() override {
    if (landed) return;
    landed = true;
    const auto decode = input == MmaInput::bf16 ? bf16_to_float : f16_to_float;
    SharedArena& arena = current_block().arena();
    auto read = [&](std::uint64_t desc, std::uint32_t row, std::uint32_t k, bool mn_major) {
      std::uint16_t bits;
      std::memcpy(&bits, arena.at(element_address(desc, row, k, *issuer, mn_major)), 2);
      return decode(bits);
    };
    float A[16][16];
    if (a_from_registers) {
      for (int l = 0; l < static_cast<int>(kWarpSize); ++l)
        for (int reg = 0; reg < 4; ++reg)
          for (int half = 0; half < 2; ++half) {
            const MatrixCoord x = mma_a_coord(l, reg, half);
            A[x.row][x.col] = decode(half_of(a[static_cast<std::size_t>(l)][static_cast<std::size_t>(reg)], half));
          }
    } else {
      for (std::uint32_t r = 0; r < 16; ++r)
        for (std::uint32_t k = 0; k < 16; ++k)
          A[r][k] = read(desc_a, 16 * warp_in_group + r, k, a_mn_major);
    }
    std::vector<float> B(static_cast<std::size_t>(n) * 16);
    for (std::uint32_t c = 0; c < n; ++c)
      for (std::uint32_t k = 0; k < 16; ++k) B[c * 16 + k] = read(desc_b, c, k, b_mn_major);
    for (unsigned l = 0; l < kWarpSize; ++l)
      for (unsigned i = 0; i < n / 2; ++i) {
        const MatrixCoord y = wgmma_d_coord(static_cast<int>(l), static_cast<int>(i));
        float sum = scale_d ? d[l][i] : 0.0f;
        for (int k = 0; k < 16; ++k) sum += A[y.row][k] * B[static_cast<std::size_t>(y.col) * 16 + static_cast<std::size_t>(k)];
        d[l][i] = sum;
      }
  }
};

class WgmmaOp final : public WarpOp {
 public:
  WgmmaOp(MmaInput input, unsigned n, float* d, std::uint64_t desc_a, const std::uint32_t* a,
          std::uint64_t desc_b, bool scale_d, bool trans_a, bool trans_b)
      : input_(input),
        n_(n),
        d_(d),
        desc_a_(desc_a),
        desc_b_(desc_b),
        scale_d_(scale_d),
        trans_a_(trans_a),
        trans_b_(trans_b) {
    name_ = "wgmma.mma_async.sync.aligned.m64n" + std::to_string(n) + "k16.f32." +
            (input == MmaInput::bf16 ? "bf16.bf16" : "f16.f16") + (a ? " (A in registers)" : "") +
            (trans_a ? " (A M-major)" : "") + (trans_b ? " (B N-major)" : "");
    if (a) {
      a_from_registers_ = true;
      for (int i = 0; i < 4; ++i) a_[static_cast<std::size_t>(i)] = a[i];
    }
  }
  std::string_view name() const override { return name_; }
  void perform(const WarpLanes& lanes) override {
    auto op = std::make_shared<WgmmaCompute>();
    op->input = input_;
    op->n = n_;
    op->scale_d = scale_d_;
    op->desc_a = desc_a_;
    op->desc_b = desc_b_;
    op->a_from_registers = a_from_registers_;
    op->a_mn_major = trans_a_;
    op->b_mn_major = trans_b_;
    for (unsigned l = 0; l < kWarpSize; ++l) {
      const WgmmaOp& me = lane_op<WgmmaOp>(lanes, l);
      const ThreadState& t = *lanes.thread[l];
      if (!t.wgmma_fenced) {
        fault_at(t, name_ + " without a wgmma.fence since the thread's last wgmma.wait_group "
                            "(or its start)");
      }
      if (me.desc_b_ != desc_b_ || me.scale_d_ != scale_d_ || (!a_from_registers_ && me.desc_a_ != desc_a_)) {
        fault_at(t, name_ + ": lanes of one warp pass different descriptors or scale-d");
      }
      op->d[l] = me.d_;
      op->a[l] = me.a_;
    }
    op->issuer = lanes.thread[0];
    op->warp_in_group = lanes.thread[0]->warp % 4;
    for (unsigned l = 0; l < kWarpSize; ++l) {
      auto& t = const_cast<ThreadState&>(*lanes.thread[l]);
      t.wgmma_open.push_back(op);
      ++t.wgmma_issued;
    }
    if (current_block().mode().landing == CpAsyncLanding::at_copy) op->land();
  }

 private:
  std::string name_;
  MmaInput input_;
  unsigned n_;
  float* d_;
  std::uint64_t desc_a_, desc_b_;
  bool scale_d_, trans_a_, trans_b_;
  bool a_from_registers_ = false;
  std::array<std::uint32_t, 4> a_{};
};

void issue(MmaInput input, unsigned n, float* d, std::uint64_t desc_a, const std::uint32_t* a,
           std::uint64_t desc_b, bool scale_d, bool trans_a, bool trans_b,
           std::source_location where) {
  ThreadState& t = current_thread();
  BlockRunner& block = current_block();
  if (n < 8 || n > 256 || n % 8 != 0) {
    fault_here("wgmma.mma_async m64n" + std::to_string(n) + "k16: N must be a multiple of 8 in 8..256" +
               at(where));
  }
  const unsigned threads = static_cast<unsigned>(volume(block.config().block));
  const unsigned group_end = (t.warp / 4 + 1) * 4 * kWarpSize;
  if (group_end > threads) {
    fault_here("wgmma.mma_async in warp " + std::to_string(t.warp) +
               ", which is not in a full warpgroup (4 warps; the block has " +
               std::to_string(threads) + " threads)" + at(where));
  }
  WgmmaOp op(input, n, d, desc_a, a, desc_b, scale_d, trans_a, trans_b);
  arrive_at_warp_op(op, 0, true, where);
}

}  // namespace

std::uint64_t make_gmma_descriptor(SharedAddress start, std::uint32_t leading_byte_offset,
                                   std::uint32_t stride_byte_offset, GmmaSwizzle swizzle) {
  return (static_cast<std::uint64_t>((start.offset >> 4) & 0x3fff)) |
         (static_cast<std::uint64_t>((leading_byte_offset >> 4) & 0x3fff) << 16) |
         (static_cast<std::uint64_t>((stride_byte_offset >> 4) & 0x3fff) << 32) |
         (static_cast<std::uint64_t>(swizzle) << 62);
}

std::uint32_t gmma_element_address(std::uint64_t desc, std::uint32_t row, std::uint32_t k,
                                   bool mn_major) {
  return element_address(desc, row, k, current_thread(), mn_major);
}

void wgmma_fence(std::source_location) { current_thread().wgmma_fenced = true; }

void wgmma_commit_group(std::source_location) {
  ThreadState& t = current_thread();
  t.wgmma_groups.push_back(std::move(t.wgmma_open));
  t.wgmma_open.clear();
}

void wgmma_wait_group(unsigned pending, std::source_location) {
  ThreadState& t = current_thread();
  while (t.wgmma_groups.size() > pending) {
    for (const auto& op : t.wgmma_groups.front()) op->land();
    t.wgmma_groups.erase(t.wgmma_groups.begin());
  }
  t.wgmma_fenced = false;
}

void wgmma_m64k16_ss(MmaInput input, unsigned n, float* d, std::uint64_t desc_a,
                     std::uint64_t desc_b, bool scale_d, bool trans_a, bool trans_b,
                     std::source_location where) {
  issue(input, n, d, desc_a, nullptr, desc_b, scale_d, trans_a, trans_b, where);
}

void wgmma_m64k16_rs(MmaInput input, unsigned n, float* d, const std::uint32_t (&a)[4],
                     std::uint64_t desc_b, bool scale_d, bool trans_b, std::source_location where) {
  issue(input, n, d, 0, a, desc_b, scale_d, false, trans_b, where);
}

}  // namespace ringattn::emu
