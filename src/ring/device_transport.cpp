#include "ring/device_transport.hpp"

#include "ringattn/errors.hpp"
#include "ringattn/field_words.hpp"

namespace ringattn::ring {

DeviceTransport choose_device_transport(const DeviceTransportContext& c) {
  if (c.world_size <= 1) return DeviceTransport::none;
  const bool sharing = c.in_process && c.gpus < c.world_size;
  if (c.requested == "mpi")
    throw InputError("transport",
                     "'mpi' moves host memory, and the GPU engines exchange device memory (NCCL, "
                     "or device copies between virtual ranks); use " +
                         field_is("transport", "nccl") + " or auto, or " +
                         field_is("device", "cpu"));
  if (c.requested == "local") {
    if (!c.in_process)
      throw InputError("transport",
                       "'local' moves device memory only between virtual ranks of one "
                       "process (run_virtual_ranks); use " +
                           field_is("transport", "nccl") + " or auto");
    return DeviceTransport::device_copies;
  }
  if (c.requested == "nccl") {
    if (sharing)
      throw InputError("transport",
                       "'nccl' needs one GPU per rank, and " + std::to_string(c.world_size) +
                           " ranks share " + std::to_string(c.gpus) + " GPU(s); use " +
                           field_is("transport", "local") + " or auto (device copies)");
    return DeviceTransport::nccl;
  }
  return sharing ? DeviceTransport::device_copies : DeviceTransport::nccl;
}

int device_of_rank(DeviceTransport t, int rank, int local_rank, int gpus) {
  gpus = gpus < 1 ? 1 : gpus;
  if (t == DeviceTransport::device_copies) return rank % gpus;
  return gpus == 1 ? 0 : local_rank;
}

}  // namespace ringattn::ring
