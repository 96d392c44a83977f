// A HostTransport over a torch.distributed process group (see group_comm.cpp).
#pragma once

#include <nanobind/nanobind.h>

#include <memory>

#include "ringattn/transport.hpp"

namespace ringattn::python {

// `group`: a ringattn._comm._TorchGroup (rank, size, local_rank, describe(), isend, irecv,
// barrier, allgather, broadcast).
std::shared_ptr<HostTransport> make_group_transport(nanobind::object group);

}  // namespace ringattn::python
