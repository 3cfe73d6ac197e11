# Locates the cudnn backend's dependencies in the Python environments a build can see, so
# neither `pip install .` nor scripts/build needs a hand-written path:
#   strideattn_python_deps()  sets, in the caller's scope (empty when not found):
#     STRIDEATTN_PY_FRONTEND_INCLUDE  directory with cudnn_frontend.h (nvidia-cudnn-frontend)
#     STRIDEATTN_PY_CUDNN_ROOT        nvidia/cudnn of the nvidia-cudnn-cu13 wheel
#     STRIDEATTN_PY_PLATLIB           site-packages of the environment being built for
# Interpreters asked, in order: the one scikit-build-core (or the caller) gives as
# Python_EXECUTABLE / Python3_EXECUTABLE, the repository's .venv, python3 on PATH. Each is
# asked twice: as it runs (under pip's build isolation that is the build environment, where
# build requirements such as the frontend live) and with -E (the interpreter's own
# environment, the one pip installs into, where a cuDNN wheel lives).
function(strideattn_python_deps)
  set(_pythons)
  foreach(_p IN ITEMS "${Python_EXECUTABLE}" "${Python3_EXECUTABLE}"
                      "${PROJECT_SOURCE_DIR}/.venv/bin/python")
    if(_p AND EXISTS "${_p}")
      list(APPEND _pythons "${_p}")
    endif()
  endforeach()
  find_program(STRIDEATTN_PATH_PYTHON3 python3)
  if(STRIDEATTN_PATH_PYTHON3)
    list(APPEND _pythons "${STRIDEATTN_PATH_PYTHON3}")
  endif()
  list(REMOVE_DUPLICATES _pythons)
  set(_fe "")
  set(_cudnn "")
  set(_platlib "")
  foreach(_py IN LISTS _pythons)
    foreach(_mode IN ITEMS "-E" "")
      execute_process(COMMAND "${_py}" ${_mode} "${CMAKE_CURRENT_FUNCTION_LIST_DIR}/find_python_deps.py"
                      OUTPUT_VARIABLE _out ERROR_QUIET RESULT_VARIABLE _rc TIMEOUT 60)
      if(NOT _rc EQUAL 0)
        continue()
      endif()
      string(REPLACE "\n" ";" _lines "${_out}")
      foreach(_line IN LISTS _lines)
        if(_line MATCHES "^frontend_include=(.+)$" AND NOT _fe)
          set(_fe "${CMAKE_MATCH_1}")
        elseif(_line MATCHES "^cudnn_root=(.+)$" AND NOT _cudnn)
          set(_cudnn "${CMAKE_MATCH_1}")
        elseif(_line MATCHES "^platlib=(.+)$" AND NOT _platlib AND _mode STREQUAL "-E")
          set(_platlib "${CMAKE_MATCH_1}")
        endif()
      endforeach()
    endforeach()
  endforeach()
  set(STRIDEATTN_PY_FRONTEND_INCLUDE "${_fe}" PARENT_SCOPE)
  set(STRIDEATTN_PY_CUDNN_ROOT "${_cudnn}" PARENT_SCOPE)
  set(STRIDEATTN_PY_PLATLIB "${_platlib}" PARENT_SCOPE)
endfunction()
