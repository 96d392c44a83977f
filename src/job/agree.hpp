// Setup errors that every rank of a job raises together: runs `f` on every rank and, if it
// throws on any, throws on every rank the lowest failing rank's error (InputError or
// RuntimeFailure, its subject and message, with rank() naming that rank), so no rank is left
// waiting in a later collective or exchange. Two collectives when nothing fails. make_engine
// and the front ends' own setup steps use it.
#pragma once

#include <climits>
#include <cstdint>
#include <exception>
#include <new>
#include <string>

#include "ring/communicator.hpp"
#include "ringattn/errors.hpp"

namespace ringattn::job {

template <typename F>
void agree_on_errors(ring::Communicator& comm, F&& f) {
  enum Kind : int64_t { none = 0, input = 1, runtime = 2 };
  int64_t kind = none;
  int rank = -1;  // an error agreed on before keeps the rank it came from
  std::string subject, problem;
  try {
    f();
  } catch (const InputError& e) {
    kind = input, subject = e.subject(), problem = e.problem(), rank = e.rank();
  } catch (const RuntimeFailure& e) {
    kind = runtime, problem = e.what(), rank = e.rank();
  } catch (const std::bad_alloc&) {
    kind = runtime;
    problem =
        "out of memory; use more ranks or a smaller "
        "config.shape.seq_len/config.shape.batch/config.shape.heads";
  } catch (const std::exception& e) {
    kind = runtime, problem = e.what();
  }
  if (comm.size() == 1) {
    if (kind == input) throw InputError(subject, problem).from_rank(rank);
    if (kind == runtime) throw RuntimeFailure(problem).from_rank(rank);
    return;
  }
  if (comm.max(kind) == none) return;
  const auto first_bad =
      static_cast<int>(-comm.max(kind != none ? -static_cast<int64_t>(comm.rank()) : INT64_MIN));
  if (kind != none && rank < 0) rank = comm.rank();
  comm.broadcast(&kind, sizeof kind, first_bad);
  comm.broadcast(&rank, sizeof rank, first_bad);
  for (std::string* text : {&subject, &problem}) {
    uint64_t length = text->size();
    comm.broadcast(&length, sizeof length, first_bad);
    text->resize(length);
    comm.broadcast(text->data(), length, first_bad);
  }
  if (kind == input) throw InputError(subject, problem).from_rank(rank);
  throw RuntimeFailure(problem).from_rank(rank);
}

}  // namespace ringattn::job
