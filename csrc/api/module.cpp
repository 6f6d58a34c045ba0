// Python module init for mla_decode._C. The module holds no functions: importing
// it loads the shared library, whose static initialisers register the
// operators with torch.ops.mla_decode (schema.cpp, dispatch_*.cpp).
#include <Python.h>

extern "C" PyMODINIT_FUNC PyInit__C(void) {
  static struct PyModuleDef module_def = {
      PyModuleDef_HEAD_INIT,
      "_C",
      "mla_decode native library; operators are under torch.ops.mla_decode",
      -1,
      nullptr,
  };
  return PyModule_Create(&module_def);
}
