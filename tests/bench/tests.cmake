# Tests of bench/ that need no GPU (Python standard library only): the rendered summary in
# bench/README.md matches the data in bench/results/, the generated ctypes description of the
# C ABI matches the header (and, outside sanitizer builds, calls libstrideattn_c.so through
# it), and the command lines and data records of compare_sdpa.py and host_overhead.py,
# decode.py's command line and table, and features.py's command line, rounds, costs, target
# checks and tables.
find_package(Python3 COMPONENTS Interpreter)
if(NOT Python3_Interpreter_FOUND)
  message(STATUS "strideattn: no Python 3 interpreter; the bench/ tests are not registered")
  return()
endif()
add_test(NAME bench_render COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/render_test.py)
add_test(NAME bench_compare_sdpa COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/compare_sdpa_test.py)
add_test(NAME bench_host_overhead COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/host_overhead_test.py)
add_test(NAME bench_decode COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/decode_test.py)
add_test(NAME bench_features COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/features_test.py)
# A library built with sanitizers cannot be loaded into a plain Python process: there the
# test checks the generated module and the struct layout only.
set(_abi_env "SA_CXX=${CMAKE_CXX_COMPILER}")
if(NOT CMAKE_CXX_FLAGS MATCHES "sanitize")
  list(APPEND _abi_env "SA_C_LIB=$<TARGET_FILE:strideattn_c>")
endif()
add_test(NAME bench_abi COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/abi_test.py)
set_tests_properties(bench_abi PROPERTIES ENVIRONMENT "${_abi_env}")
set_tests_properties(bench_render bench_compare_sdpa bench_host_overhead bench_decode bench_features bench_abi PROPERTIES LABELS cpu TIMEOUT 120)
# src/dispatch/speed_table.inc is the newest full-list data file's (bench/gen_speed_table.py).
add_test(NAME bench_speed_table COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/bench/gen_speed_table.py --check)
set_tests_properties(bench_speed_table PROPERTIES LABELS cpu TIMEOUT 60)
