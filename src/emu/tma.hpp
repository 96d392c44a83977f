// The tensor memory accelerator on the CPU: tensor maps as cuTensorMapEncodeTiled encodes
// them (refused where the driver refuses them), and cp.async.bulk.tensor copies of one box
// from global to shared memory, swizzled as the map says, out-of-bounds elements filled,
// their bytes completing on an mbarrier (landing as bulk copies do: emu/mbarrier.hpp).
//
// A box is stored densely in shared memory, dimension 0 fastest: box[0]·elem bytes per row,
// rows in the order of the outer dimensions. Swizzling permutes the 16-byte units of each
// row within an atom of 8 rows: the unit index is XORed with bits of the row (CUTLASS's
// Swizzle<B, 4, 3> on byte offsets, B = 1, 2, 3 for 32, 64, 128 bytes), which is what a
// wgmma shared-memory descriptor with the same swizzle mode reads back.
#pragma once

#include <array>
#include <cstdint>
#include <source_location>
#include <span>
#include <string>

#include "emu/shared_memory.hpp"

namespace ringattn::emu {

enum class TmaSwizzle : std::uint8_t { none, bytes32, bytes64, bytes128 };
enum class TmaOobFill : std::uint8_t { zeros, nan };  // CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE / NAN_REQUEST_ZERO_FMA

// What the emulator's CUtensorMap holds (it fits the driver's opaque 128 bytes).
struct TensorMap {
  std::uint32_t magic = 0;  // set by encode_tensor_map_tiled
  std::uint32_t rank = 0, elem_bytes = 0;
  TmaSwizzle swizzle = TmaSwizzle::none;
  TmaOobFill oob = TmaOobFill::zeros;
  const void* base = nullptr;
  std::array<std::uint64_t, 5> dims{};     // elements
  std::array<std::uint64_t, 5> strides{};  // bytes; strides[0] = elem_bytes
  std::array<std::uint32_t, 5> box{};      // elements
};

// cuTensorMapEncodeTiled with interleave none and element strides of 1: `strides` holds the
// rank - 1 byte strides of dimensions 1.., as the driver takes them. Returns "" or why the
// driver would refuse the map (CUDA_ERROR_INVALID_VALUE): rank 1-5, base 16-byte aligned,
// strides multiples of 16 below 2^40 and not smaller than the dimension below them spans,
// box dimensions 1-256, box[0]·elem a multiple of 16 bytes and, when swizzled, at most the
// swizzle's span.
std::string encode_tensor_map_tiled(TensorMap& map, std::uint32_t elem_bytes, std::uint32_t rank,
                                    const void* base, std::span<const std::uint64_t> dims,
                                    std::span<const std::uint64_t> strides,
                                    std::span<const std::uint32_t> box, TmaSwizzle swizzle,
                                    TmaOobFill oob);

// Where byte `offset` of a box lands, relative to the box's start in shared memory.
std::uint32_t tma_swizzled_offset(TmaSwizzle swizzle, std::uint32_t offset);

// The alignment a box's shared-memory destination needs: 128 bytes, or the swizzle atom
// (8 rows of its span: 256, 512, 1024 bytes).
std::uint32_t tma_destination_alignment(TmaSwizzle swizzle);

// The bytes one box copy moves (and completes on its barrier), out-of-bounds fill included.
std::uint32_t tma_box_bytes(const TensorMap& map);

// cp.async.bulk.tensor.Nd.shared::cluster.global.mbarrier::complete_tx::bytes [dst],
// [map, {coords}], [bar]: the box whose first element is at `coords` (dimension 0 first; may
// lie partly or wholly outside the tensor, those elements filled per map.oob).
void cp_async_bulk_tensor(SharedAddress dst, const TensorMap& map,
                          std::span<const std::int32_t> coords, SharedAddress bar,
                          std::source_location where = std::source_location::current());

}  // namespace ringattn::emu
