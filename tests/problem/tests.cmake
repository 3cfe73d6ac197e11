# Tests of validation, the overlap algebra, layout description, the harness's layout views and
# the C ABI.
strideattn_test(problem_validate_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/validate_test.cpp)
strideattn_test(problem_overlap_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/overlap_test.cpp)
strideattn_test(problem_layout_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/layout_test.cpp)

# The C ABI through the shared library; c_header_check.c is compiled as C.
enable_language(C)
strideattn_test(c_api_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/../c_api/c_api_test.cpp
                                   ${CMAKE_CURRENT_LIST_DIR}/../c_api/c_header_check.c)
target_link_libraries(c_api_test PRIVATE strideattn_c)
strideattn_test(problem_reversed_views_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/reversed_views_test.cpp)
# The C ABI of KV-cache attention; c_kvcache_check.c is compiled as C.
strideattn_test(c_api_kvcache_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/../c_api/c_kvcache_test.cpp
                                           ${CMAKE_CURRENT_LIST_DIR}/../c_api/c_kvcache_check.c)
target_link_libraries(c_api_kvcache_test PRIVATE strideattn_c)
