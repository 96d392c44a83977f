// Test-only: device arrays made by the extension itself, handed out through DLPack as CUDA
// tensors, so that the device path of AttentionOp (device checks, dtypes, the caller's
// stream) runs where no torch with CUDA does: under the emulated GPU in CI
// (python/tests/test_device_arrays.py), and on a lent GPU beside torch's own tensors. Not
// the package's API: the names start with _testing. Builds without CUDA raise the engine's
// "no CUDA kernels" error.
#include "testing_device.hpp"

#include <nanobind/ndarray.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>

#include <string>
#include <utility>
#include <vector>

#include "ringattn/device.hpp"
#include "ringattn/errors.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace ringattn::python {
namespace {

struct TestingDeviceArray {
  DeviceBuffer buf;
  std::vector<std::size_t> shape;
  DeviceDType dtype = DeviceDType::fp32;
  int device = 0;
};

nb::dlpack::dtype dlpack_of(DeviceDType t) {
  if (t == DeviceDType::fp32) return nb::dtype<float>();
  const auto code =
      t == DeviceDType::bf16 ? nb::dlpack::dtype_code::Bfloat : nb::dlpack::dtype_code::Float;
  return {static_cast<uint8_t>(code), 16, 1};
}

}  // namespace

void register_testing_device_arrays(nb::module_& m) {
  nb::class_<TestingDeviceArray>(m, "_TestingDeviceArray")
      // The DLPack protocol, as a CUDA tensor of torch or CuPy offers it: the extension's
      // ndarray arguments take the object itself.
      .def("__dlpack__",
           [](nb::handle self, nb::kwargs) {
             auto& a = nb::cast<TestingDeviceArray&>(self);
             return nb::ndarray<>(a.buf.data(), a.shape.size(), a.shape.data(), self, nullptr,
                                  dlpack_of(a.dtype), nb::device::cuda::value, a.device);
           })
      .def("__dlpack_device__",
           [](const TestingDeviceArray& a) {
             return std::make_pair(static_cast<int>(nb::device::cuda::value), a.device);
           })
      .def("to_host", [](const TestingDeviceArray& a) {
        if (a.dtype != DeviceDType::fp32)
          throw InputError("to_host", "reads float32 device arrays only");
        std::size_t n = 1;
        for (const std::size_t d : a.shape) n *= d;
        auto* host = new std::vector<float>(n);
        a.buf.download(host->data(), n);
        nb::capsule owner(host,
                          [](void* p) noexcept { delete static_cast<std::vector<float>*>(p); });
        return nb::ndarray<nb::numpy, float>(host->data(), a.shape.size(), a.shape.data(), owner);
      });
  m.def(
      "_testing_device_array",
      [](nb::ndarray<float, nb::c_contig, nb::device::cpu> host, const std::string& dtype,
         int device) {
        TestingDeviceArray a;
        a.dtype = dtype == "bf16"   ? DeviceDType::bf16
                  : dtype == "fp16" ? DeviceDType::fp16
                                    : DeviceDType::fp32;
        a.device = device;
        for (std::size_t i = 0; i < host.ndim(); ++i) a.shape.push_back(host.shape(i));
        a.buf =
            DeviceBuffer(host.size() * bytes_per_element(a.dtype), "a test's device array", device);
        a.buf.upload(host.data(), host.size(), a.dtype);
        return a;
      },
      "host"_a, "dtype"_a = "fp32", "device"_a = 0,
      "Test-only: a device copy of a float32 host array, in `dtype`, on CUDA device `device`.");
}

}  // namespace ringattn::python
