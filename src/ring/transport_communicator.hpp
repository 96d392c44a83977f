// A transport a caller brings (ringattn/transport.hpp) as the ring's Communicator: host
// memory only, no device events; the collectives it does not have are built from the ones it
// does.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ring/communicator.hpp"
#include "ringattn/transport.hpp"

namespace ringattn::ring {

std::unique_ptr<Communicator> make_transport_communicator(std::shared_ptr<HostTransport> t);

// Every rank's `mine` on rank 0, in rank order (empty elsewhere), over any communicator's
// fixed-size gather: two collectives.
std::vector<std::string> gather_strings(Communicator& comm, const std::string& mine);

}  // namespace ringattn::ring
