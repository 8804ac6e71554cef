# cmake -DBINARY=<file> -P check_needed.cmake: fails when the dynamic section of BINARY needs a
# library kvnode::client must not bring into an engine's process (ZeroMQ, UCX, yaml-cpp,
# httplib, CUDA, verbs), or when it cannot be read at all.
execute_process(COMMAND readelf -d ${BINARY} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "readelf -d ${BINARY} failed (${rc}): ${err}")
endif()
string(REGEX MATCHALL "\\(NEEDED\\)[^\n]*" needed "${out}")
if(NOT needed)
  message(FATAL_ERROR "${BINARY} has no NEEDED entries: not the dynamic executable expected")
endif()
set(heavy "")
foreach(line IN LISTS needed)
  if(line MATCHES "\\[(lib(zmq|ucp|ucs|uct|ucm|yaml-cpp|httplib|cuda|cudart|ibverbs|rdmacm)[^]]*)\\]")
    list(APPEND heavy ${CMAKE_MATCH_1})
  endif()
endforeach()
if(heavy)
  message(FATAL_ERROR "${BINARY} needs ${heavy}: kvnode::client must not link them")
endif()
message(STATUS "${BINARY} needs only: ${needed}")
