// The library's side of a Comm: the ring::Communicator underneath it, and Comms made from
// communicators the library (or a test) already holds. Internal: front ends hold Comms only.
#pragma once

#include <memory>

#include "ring/communicator.hpp"
#include "ringattn/ringattn.hpp"

namespace ringattn {

struct CommAccess {
  static Comm make(std::shared_ptr<ring::Communicator> comm);
  // A Comm over `comm`, which the caller keeps alive while the Comm and its engines live.
  static Comm borrow(ring::Communicator& comm);
  static ring::Communicator& communicator(const Comm& c);
};

}  // namespace ringattn
