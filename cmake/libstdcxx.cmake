# The libstdc++ guard of setup.py (links_libstdcxx_statically, libstdcxx_link_args) for CMake builds.
#
# A compiler that links libstdc++ statically into shared objects (a toolchain built with static standard
# libraries, or with libstdc++.a alone) gives the op library a private copy of the C++ runtime: its functions
# then run on torch's streams and locale, and an error message that formats a number (c10::str, every
# TORCH_CHECK with an index) crashes or comes out truncated. specdec_libstdcxx_check links a two-line probe
# with the compiler; when the probe does not depend on libstdc++.so, SPECDEC_LIBSTDCXX is set to the
# libstdc++ the given Python's torch runs with, for the library to link by path (before the compiler's own
# archive: every symbol it has is then linked dynamically).
#
# Script mode, for the tests: cmake -DCXX=<compiler> [-DPYTHON=<python>] -P cmake/libstdcxx.cmake prints
# "static: <lib>", "static: none found" or "shared".

function(specdec_libstdcxx_check compiler python out_var)
  set(${out_var} "" PARENT_SCOPE)
  set(dir "${CMAKE_CURRENT_BINARY_DIR}/specdec_libstdcxx_probe")
  file(MAKE_DIRECTORY "${dir}")
  file(WRITE "${dir}/probe.cpp"
       "#include <sstream>\nstd::string text(unsigned long x) { std::ostringstream s; s << x; return s.str(); }\n")
  separate_arguments(command UNIX_COMMAND "${compiler}")
  execute_process(COMMAND ${command} -shared -fPIC -O0 "${dir}/probe.cpp" -o "${dir}/probe.so"
                  RESULT_VARIABLE built OUTPUT_QUIET ERROR_QUIET)
  if(NOT built EQUAL 0)
    return()  # no verdict
  endif()
  find_program(SPECDEC_READELF NAMES readelf)
  if(NOT SPECDEC_READELF)
    return()
  endif()
  execute_process(COMMAND ${SPECDEC_READELF} -d "${dir}/probe.so" OUTPUT_VARIABLE dynamic ERROR_QUIET)
  if(dynamic MATCHES "NEEDED[^\n]*libstdc\\+\\+\\.so")
    set(SPECDEC_LIBSTDCXX_STATIC OFF PARENT_SCOPE)
    return()
  endif()
  set(SPECDEC_LIBSTDCXX_STATIC ON PARENT_SCOPE)
  if(python)
    execute_process(
      COMMAND "${python}" -c
              "import torch\nwith open('/proc/self/maps') as f:\n    print(sorted({l.split()[-1] for l in f if '/libstdc++.so' in l})[0])"
      OUTPUT_VARIABLE lib OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE found ERROR_QUIET)
    if(found EQUAL 0 AND EXISTS "${lib}")
      set(${out_var} "${lib}" PARENT_SCOPE)
    endif()
  endif()
endfunction()

if(CMAKE_SCRIPT_MODE_FILE STREQUAL CMAKE_CURRENT_LIST_FILE)
  if(NOT CMAKE_CURRENT_BINARY_DIR)
    set(CMAKE_CURRENT_BINARY_DIR "${CMAKE_BINARY_DIR}")
  endif()
  specdec_libstdcxx_check("${CXX}" "${PYTHON}" lib)
  if(NOT DEFINED SPECDEC_LIBSTDCXX_STATIC)
    message("no verdict")
  elseif(NOT SPECDEC_LIBSTDCXX_STATIC)
    message("shared")
  elseif(lib)
    message("static: ${lib}")
  else()
    message("static: none found")
  endif()
endif()
