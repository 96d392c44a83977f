// Tensor maps and box copies (see tma.hpp).
#include "emu/tma.hpp"

#include <cstring>
#include <limits>
#include <vector>

#include "emu/block_runner.hpp"
#include "emu/bulk_reduce.hpp"
#include "emu/mbarrier.hpp"

namespace ringattn::emu {
namespace {

constexpr std::uint32_t kMagic = 0x544d4150;  // "TMAP"

std::uint32_t span_of(TmaSwizzle s) {
  switch (s) {
    case TmaSwizzle::bytes32:
      return 32;
    case TmaSwizzle::bytes64:
      return 64;
    case TmaSwizzle::bytes128:
      return 128;
    case TmaSwizzle::none:
      break;
  }
  return 0;
}

std::string at(std::source_location where) { return " (at " + describe(where) + ")"; }

}  // namespace

static_assert(sizeof(TensorMap) <= 128, "the driver's CUtensorMap is 128 bytes");

std::string encode_tensor_map_tiled(TensorMap& map, std::uint32_t elem_bytes, std::uint32_t rank,
                                    const void* base, std::span<const std::uint64_t> dims,
                                    std::span<const std::uint64_t> strides,
                                    std::span<const std::uint32_t> box, TmaSwizzle swizzle,
                                    TmaOobFill oob) {
  map = TensorMap{};
  if (rank < 1 || rank > 5) return "rank " + std::to_string(rank) + " (1 to 5)";
  if (elem_bytes != 1 && elem_bytes != 2 && elem_bytes != 4 && elem_bytes != 8)
    return "element size " + std::to_string(elem_bytes) + " bytes";
  if (dims.size() != rank || strides.size() != rank - 1 || box.size() != rank)
    return "dims, strides and box must have rank, rank - 1 and rank entries";
  if (reinterpret_cast<std::uintptr_t>(base) % 16 != 0)
    return "globalAddress is not 16-byte aligned";
  map.rank = rank;
  map.elem_bytes = elem_bytes;
  map.base = base;
  map.swizzle = swizzle;
  map.oob = oob;
  map.strides[0] = elem_bytes;
  for (std::uint32_t d = 0; d < rank; ++d) {
    if (dims[d] == 0 || dims[d] > (std::uint64_t{1} << 32))
      return "globalDim[" + std::to_string(d) + "] = " + std::to_string(dims[d]) + " (1 to 2^32)";
    if (box[d] == 0 || box[d] > 256)
      return "boxDim[" + std::to_string(d) + "] = " + std::to_string(box[d]) + " (1 to 256)";
    map.dims[d] = dims[d];
    map.box[d] = box[d];
    if (d == 0) continue;
    const std::uint64_t s = strides[d - 1];
    if (s % 16 != 0 || s >= (std::uint64_t{1} << 40))
      return "globalStrides[" + std::to_string(d - 1) + "] = " + std::to_string(s) +
             " (a multiple of 16 below 2^40)";
    if (s < map.strides[d - 1] * dims[d - 1])
      return "globalStrides[" + std::to_string(d - 1) + "] = " + std::to_string(s) +
             " is smaller than dimension " + std::to_string(d - 1) + " spans";
    map.strides[d] = s;
  }
  const std::uint64_t inner = std::uint64_t{box[0]} * elem_bytes;
  if (inner % 16 != 0)
    return "boxDim[0] · element size = " + std::to_string(inner) + " bytes (a multiple of 16)";
  if (swizzle != TmaSwizzle::none && inner > span_of(swizzle))
    return "boxDim[0] · element size = " + std::to_string(inner) + " bytes exceeds the " +
           std::to_string(span_of(swizzle)) + "-byte swizzle span";
  map.magic = kMagic;
  return "";
}

std::uint32_t tma_swizzled_offset(TmaSwizzle swizzle, std::uint32_t offset) {
  // Swizzle<B, 4, 3>: bits [7, 7 + B) XORed into bits [4, 4 + B).
  std::uint32_t b = 0;
  switch (swizzle) {
    case TmaSwizzle::bytes32:
      b = 1;
      break;
    case TmaSwizzle::bytes64:
      b = 2;
      break;
    case TmaSwizzle::bytes128:
      b = 3;
      break;
    case TmaSwizzle::none:
      return offset;
  }
  const std::uint32_t mask = ((1u << b) - 1u) << 7;
  return offset ^ ((offset & mask) >> 3);
}

std::uint32_t tma_destination_alignment(TmaSwizzle swizzle) {
  return swizzle == TmaSwizzle::none ? 128 : 8 * span_of(swizzle);
}

std::uint32_t tma_box_bytes(const TensorMap& map) {
  std::uint32_t n = map.elem_bytes;
  for (std::uint32_t d = 0; d < map.rank; ++d) n *= map.box[d];
  return n;
}

void cp_async_bulk_tensor(SharedAddress dst, const TensorMap& map,
                          std::span<const std::int32_t> coords, SharedAddress bar,
                          std::source_location where) {
  const std::string call =
      "cp.async.bulk.tensor" + (map.rank ? "." + std::to_string(map.rank) + "d" : std::string());
  if (map.magic != kMagic) fault_here(call + " with a tensor map that was never encoded" + at(where));
  if (coords.size() != map.rank) {
    fault_here(call + " with " + std::to_string(coords.size()) + " coordinates for a rank-" +
               std::to_string(map.rank) + " tensor map" + at(where));
  }
  const std::uint32_t bytes = tma_box_bytes(map);
  const std::uint32_t align = tma_destination_alignment(map.swizzle);
  SharedArena& arena = current_block().arena();
  if (dst.offset % align != 0 || !arena.contains(dst.offset, bytes)) {
    fault_here(call + " into shared offset " + std::to_string(dst.offset) +
               (dst.offset % align != 0
                    ? ", which is not " + std::to_string(align) + "-byte aligned (as its swizzle needs)"
                    : ": the " + std::to_string(bytes) + "-byte box leaves the " +
                          std::to_string(arena.size()) + "-byte arena") +
               at(where));
  }
  // The box, row by row (a row: box[0] elements along dimension 0), read at the copy.
  const std::uint32_t row_bytes = map.box[0] * map.elem_bytes;
  const std::uint32_t rows = bytes / row_bytes;
  std::vector<std::byte> image(bytes);
  std::vector<std::byte> fill(map.elem_bytes, std::byte{0});
  if (map.oob == TmaOobFill::nan) {
    if (map.elem_bytes == 4) {
      const float nan = std::numeric_limits<float>::quiet_NaN();
      std::memcpy(fill.data(), &nan, 4);
    } else if (map.elem_bytes == 2) {
      fill[0] = std::byte{0xff};  // 0x7fff: NaN in fp16 and bf16
      fill[1] = std::byte{0x7f};
    }
  }
  for (std::uint32_t r = 0; r < rows; ++r) {
    // The row's coordinates in dimensions 1.. (dimension 1 fastest).
    std::int64_t outer[5] = {};
    bool inside = true;
    std::uint64_t row_offset = 0;
    std::uint32_t rest = r;
    for (std::uint32_t d = 1; d < map.rank; ++d) {
      outer[d] = coords[d] + static_cast<std::int64_t>(rest % map.box[d]);
      rest /= map.box[d];
      inside = inside && outer[d] >= 0 && outer[d] < static_cast<std::int64_t>(map.dims[d]);
      if (inside) row_offset += static_cast<std::uint64_t>(outer[d]) * map.strides[d];
    }
    for (std::uint32_t e = 0; e < map.box[0]; ++e) {
      const std::int64_t x = coords[0] + static_cast<std::int64_t>(e);
      std::byte* out = image.data() + r * row_bytes + e * map.elem_bytes;
      if (inside && x >= 0 && x < static_cast<std::int64_t>(map.dims[0])) {
        const std::byte* from = static_cast<const std::byte*>(map.base) + row_offset +
                                static_cast<std::uint64_t>(x) * map.elem_bytes;
        detail::check_reduce_read(from, map.elem_bytes, call.c_str(), where);
        std::memcpy(out, from, map.elem_bytes);
      } else {
        std::memcpy(out, fill.data(), map.elem_bytes);
      }
    }
  }
  detail::AsyncCopy copy;
  copy.dst = dst.offset;
  copy.bytes = std::move(image);
  copy.unit_mode = static_cast<std::uint8_t>(1 + static_cast<int>(map.swizzle));
  for (std::uint32_t u = 0; u < bytes / 16; ++u) {
    const std::uint32_t to = dst.offset + tma_swizzled_offset(map.swizzle, 16 * u);
    if (!arena.contains(to, 16)) {
      fault_here(call + ": the swizzled box reaches shared offset " + std::to_string(to) +
                 ", outside the " + std::to_string(arena.size()) + "-byte arena" + at(where));
    }
    copy.units.push_back(to);
  }
  detail::issue_async_copy(bar, std::move(copy), call.c_str(), where);
}

}  // namespace ringattn::emu
