# The JAX binding, strideattn._jax_ffi: XLA FFI handlers (src/jax_ffi.cpp) compiled against
# the XLA FFI headers that jaxlib ships (jax.ffi.include_dir(), i.e. <jaxlib>/include). Built
# when those headers are found, from STRIDEATTN_XLA_FFI_INCLUDE or from the jaxlib of the
# Python being built for; without them the package builds without strideattn.jax's kernels
# and says why here and in the configure summary. The handlers use only XLA's versioned FFI
# C ABI (no jaxlib library is linked); build against the jaxlib that will run them.
set(STRIDEATTN_JAX "AUTO" CACHE STRING
    "Build the JAX binding: AUTO (when jaxlib's XLA FFI headers are found), ON (fail without them), OFF")
set_property(CACHE STRIDEATTN_JAX PROPERTY STRINGS AUTO ON OFF)
set(STRIDEATTN_XLA_FFI_INCLUDE "" CACHE PATH
    "Directory holding xla/ffi/api/ffi.h (jax.ffi.include_dir()); empty: the build Python's jaxlib")

set(_jax_note "")
set(_jax_include "")
if(STRIDEATTN_JAX STREQUAL "OFF")
  set(_jax_note "STRIDEATTN_JAX=OFF")
elseif(STRIDEATTN_XLA_FFI_INCLUDE)
  set(_jax_include "${STRIDEATTN_XLA_FFI_INCLUDE}")
  set(_jax_from "STRIDEATTN_XLA_FFI_INCLUDE")
else()
  # jax.ffi.include_dir() where jax imports; else jaxlib's own include directory.
  set(_jax_probe [=[
import os
import jaxlib.version as v
try:
    import jax.ffi
    include = jax.ffi.include_dir()
except Exception:
    include = os.path.join(os.path.dirname(v.__file__), "include")
print(include)
print(v.__version__)
]=])
  execute_process(COMMAND "${Python_EXECUTABLE}" -c "${_jax_probe}"
                  OUTPUT_VARIABLE _jax_out ERROR_QUIET RESULT_VARIABLE _jax_rc OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(_jax_rc EQUAL 0)
    string(REPLACE "\n" ";" _jax_out "${_jax_out}")
    list(GET _jax_out 0 _jax_include)
    list(GET _jax_out 1 _jax_version)
    set(_jax_from "jaxlib ${_jax_version}")
  else()
    set(_jax_note "no jaxlib for ${Python_EXECUTABLE} (pip install jaxlib, then build with --no-build-isolation)")
  endif()
endif()
if(_jax_include AND NOT EXISTS "${_jax_include}/xla/ffi/api/ffi.h")
  set(_jax_note "no xla/ffi/api/ffi.h under ${_jax_include} (${_jax_from})")
  set(_jax_include "")
endif()

if(_jax_include)
  nanobind_add_module(_jax_ffi NB_STATIC src/jax_ffi.cpp)
  target_include_directories(_jax_ffi SYSTEM PRIVATE "${_jax_include}")
  target_link_libraries(_jax_ffi PRIVATE strideattn)
  target_compile_features(_jax_ffi PRIVATE cxx_std_20)
  if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang" AND NOT APPLE)
    target_link_options(_jax_ffi PRIVATE "LINKER:--exclude-libs,ALL")
  endif()
  set_target_properties(_jax_ffi PROPERTIES INSTALL_RPATH "$ORIGIN")
  install(TARGETS _jax_ffi LIBRARY DESTINATION strideattn COMPONENT python)
  set(_jax_summary "ON  (XLA FFI headers of ${_jax_from}: ${_jax_include})")
else()
  if(STRIDEATTN_JAX STREQUAL "ON")
    message(FATAL_ERROR "strideattn python: STRIDEATTN_JAX=ON but the JAX binding cannot be built: ${_jax_note}")
  endif()
  set(_jax_summary "OFF (${_jax_note})")
endif()
message(STATUS "strideattn python: JAX binding ${_jax_summary}")
set_property(GLOBAL PROPERTY STRIDEATTN_JAX_SUMMARY "${_jax_summary}")
