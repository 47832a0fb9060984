// serve_loop's synthetic model front and output checksum over DLPack arrays: see synthetic.cpp.
#pragma once

#include <nanobind/nanobind.h>

namespace spg::python {

/// @brief Registers SyntheticFront, synthetic_fill_query, synthetic_sink_values,
///        synthetic_fill_cache and checksum_accumulate.
void bind_synthetic(nanobind::module_& m);

}  // namespace spg::python
