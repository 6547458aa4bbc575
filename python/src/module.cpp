// deepinfer._deepinfer: nanobind bindings of the C++ offline API (include/deepinfer/). The
// vLLM-style conveniences (keyword construction, prompt forms) live in python/deepinfer/.
#include "bindings.h"
#include "core/error.h"

namespace deepinfer::python {

void bind_errors(nb::module_& module) {
  // deepinfer::Error is anything the caller can fix (bad argument, file, request): a ValueError
  // subclass, so `except ValueError` catches it as it would in vLLM.
  nb::exception<Error>(module, "Error", PyExc_ValueError);
}

}  // namespace deepinfer::python

NB_MODULE(_deepinfer, module) {
  namespace py = deepinfer::python;
  module.doc() = "Bindings of deepinfer's C++ offline inference API; use the deepinfer package.";
  module.attr("__version__") = DEEPINFER_VERSION;
  py::bind_errors(module);
  py::bind_params(module);
  py::bind_outputs(module);
  py::bind_llm(module);
}
