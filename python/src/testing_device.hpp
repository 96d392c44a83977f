// Test-only device arrays (see testing_device.cpp).
#pragma once

#include <nanobind/nanobind.h>

namespace ringattn::python {

void register_testing_device_arrays(nanobind::module_& m);

}  // namespace ringattn::python
