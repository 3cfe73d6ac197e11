# The library is usable downstream: installed + find_package(strideattn), and through
# add_subdirectory() of the source tree (CPU-only there, to keep CI's build time down).
set(_consumer ${CMAKE_CURRENT_SOURCE_DIR}/packaging/consumer)
set(_work ${CMAKE_BINARY_DIR}/packaging)
# Installed to a fresh prefix: a find_package consumer builds and runs on cpu, nothing it or
# the core needs is a CUDA library, SONAMEs are versioned, the GPU module loads or explains why
# not (packaging/check_install.sh).
add_test(NAME packaging_find_package
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/packaging/check_install.sh ${CMAKE_BINARY_DIR}
          ${_consumer} ${_work}/fp ${STRIDEATTN_HAVE_CUDA})
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

# build_config.json (strideattn.build_info(), `python -m strideattn info`) records what each
# configure built, what it was asked for and why a backend is missing. A configure with the
# Python extension: the interpreter must have nanobind, as scripts/build's .venv.
find_package(Python3 COMPONENTS Interpreter QUIET)
add_test(NAME packaging_build_info
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/packaging/build_info.sh ${PROJECT_SOURCE_DIR}
          ${_work}/build_info ${Python3_EXECUTABLE} ${STRIDEATTN_HAVE_CUDA})
set_tests_properties(packaging_build_info PROPERTIES LABELS cpu TIMEOUT 300)

# The core's loader of the GPU module: failures become reasons (file, dlerror), the build's
# own module loads.
strideattn_test(packaging_gpu_loader_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/gpu_loader_test.cpp)
target_include_directories(packaging_gpu_loader_test PRIVATE ${PROJECT_BINARY_DIR}/src)
target_compile_definitions(packaging_gpu_loader_test PRIVATE
  STRIDEATTN_TEST_C_LIBRARY="$<TARGET_FILE:strideattn_c>"
  STRIDEATTN_TEST_GPU_MODULE="$<IF:$<TARGET_EXISTS:strideattn_gpu>,$<TARGET_FILE_DIR:strideattn>/${STRIDEATTN_GPU_MODULE_FILE},>")

# The GPU module carries the code CMake was asked for (SASS for each -real architecture, PTX
# for each -virtual one), and the default list keeps a PTX entry, so a GPU newer than the
# build JIT-compiles the kernels instead of failing with "no kernel image".
if(STRIDEATTN_HAVE_CUDA)
  add_test(NAME packaging_cuda_archs
    COMMAND bash -c "set -e; '${Python3_EXECUTABLE}' '${CMAKE_CURRENT_SOURCE_DIR}/packaging/fatbin_archs.py' \
      '$<TARGET_FILE:strideattn_gpu>' --expect '${CMAKE_CUDA_ARCHITECTURES}'; \
      case ';${STRIDEATTN_CUDA_ARCHS};' in *-virtual\\;*) echo 'default ${STRIDEATTN_CUDA_ARCHS}: has PTX';; \
      *) echo 'FAIL: default STRIDEATTN_CUDA_ARCHS=${STRIDEATTN_CUDA_ARCHS} has no -virtual (PTX) entry'; exit 1;; esac")
  set_tests_properties(packaging_cuda_archs PROPERTIES LABELS cpu TIMEOUT 120)

  # pip install . finds a cuDNN wheel of the environment by itself and the wheel's module
  # reaches it relative to $ORIGIN; a dropped cudnn backend is a WARNING and a summary line.
  # (A configure with CUDA: the interpreter must have nanobind, as scripts/build's .venv.)
  add_test(NAME packaging_python_deps
    COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/packaging/python_deps.sh ${PROJECT_SOURCE_DIR}
            ${_work}/python_deps ${Python3_EXECUTABLE})
  set_tests_properties(packaging_python_deps PROPERTIES LABELS cpu TIMEOUT 300)
endif()
