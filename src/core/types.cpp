// The printed names of the enums in ringattn/types.hpp (one definition, whatever the build).
#include "ringattn/types.hpp"

namespace ringattn {

const char* to_string(Device d) {
  return d == Device::cpu ? "cpu" : d == Device::cuda ? "cuda" : "auto";
}

const char* to_string(Transport t) {
  switch (t) {
    case Transport::nccl:
      return "nccl";
    case Transport::mpi:
      return "mpi";
    case Transport::local:
      return "local";
    case Transport::automatic:
      return "auto";
  }
  return "?";
}

const char* to_string(DeviceDType t) {
  switch (t) {
    case DeviceDType::bf16:
      return "bf16";
    case DeviceDType::fp16:
      return "fp16";
    case DeviceDType::fp32:
      return "fp32";
  }
  return "?";
}

const char* to_string(KernelChoice k) {
  switch (k) {
    case KernelChoice::automatic:
      return "auto";
    case KernelChoice::native:
      return "native";
    case KernelChoice::cudnn:
      return "cudnn";
    case KernelChoice::hopper:
      return "hopper";
  }
  return "?";
}

}  // namespace ringattn
