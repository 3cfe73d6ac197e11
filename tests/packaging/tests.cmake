# The library is usable downstream: installed + find_package(strideattn), and through
# add_subdirectory() of the source tree (CPU-only there, to keep CI's build time down).
set(_consumer ${CMAKE_CURRENT_SOURCE_DIR}/packaging/consumer)
set(_work ${CMAKE_BINARY_DIR}/packaging)
add_test(NAME packaging_find_package
  COMMAND ${CMAKE_COMMAND} -E env bash -c
    "set -e; rm -rf '${_work}/fp'; \
     '${CMAKE_COMMAND}' --install '${CMAKE_BINARY_DIR}' --prefix '${_work}/fp/prefix' >/dev/null; \
     '${CMAKE_COMMAND}' -S '${_consumer}' -B '${_work}/fp/build' -G Ninja -DCMAKE_PREFIX_PATH='${_work}/fp/prefix' >/dev/null; \
     '${CMAKE_COMMAND}' --build '${_work}/fp/build' >/dev/null; '${_work}/fp/build/consumer'")
add_test(NAME packaging_add_subdirectory
  COMMAND ${CMAKE_COMMAND} -E env bash -c
    "set -e; rm -rf '${_work}/as'; \
     '${CMAKE_COMMAND}' -S '${_consumer}' -B '${_work}/as' -G Ninja -DSTRIDEATTN_SOURCE='${PROJECT_SOURCE_DIR}' -DSTRIDEATTN_CUDA=OFF >/dev/null; \
     '${CMAKE_COMMAND}' --build '${_work}/as' >/dev/null; '${_work}/as/consumer'")
# The Apache-2.0 license text travels with the installed library.
add_test(NAME packaging_installs_license
  COMMAND ${CMAKE_COMMAND} -E env bash -c
    "set -e; rm -rf '${_work}/lic'; \
     '${CMAKE_COMMAND}' --install '${CMAKE_BINARY_DIR}' --prefix '${_work}/lic' >/dev/null; \
     cmp '${PROJECT_SOURCE_DIR}/LICENSE' '${_work}/lic/${CMAKE_INSTALL_DOCDIR}/LICENSE'")
set_tests_properties(packaging_find_package packaging_add_subdirectory packaging_installs_license
                     PROPERTIES LABELS cpu TIMEOUT 900)
set_tests_properties(packaging_add_subdirectory PROPERTIES RUN_SERIAL TRUE)

# STRIDEATTN_REQUIRE_CUDNN (what scripts/gpu-check sets): a configure that cannot build the
# cudnn backend fails with the reason instead of leaving a build whose cudnn tests all refuse.
add_test(NAME packaging_require_cudnn_refuses
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/packaging/require_cudnn.sh ${PROJECT_SOURCE_DIR}
          ${_work}/require_cudnn ${STRIDEATTN_HAVE_CUDA})
set_tests_properties(packaging_require_cudnn_refuses PROPERTIES LABELS cpu TIMEOUT 300)
