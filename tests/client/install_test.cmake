# cmake -DBUILD_DIR= -DPROJECT_DIR= -DWORK_DIR= -DGENERATOR= -DC_COMPILER= -DCXX_COMPILER=
#       [-DFLAGS=] -P install_test.cmake
# What an engine developer does: install kvnode's client (cmake --install) into a fresh prefix,
# then build against that tree alone: install_project/ through find_package(kvnode), and its C
# example with gcc and pkg-config alone. Each example (the README's three) then runs with no node
# and must fail cleanly, printing the status and the client's message ("not_found: no kvnode
# local socket at ...", exit 1). FLAGS: the Sanitize build's -fsanitize flags, which code
# linking its libraries needs too.
set(prefix ${WORK_DIR}/prefix)
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})

function(run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc}):\n${ARGN}\n${out}")
  endif()
  message(STATUS "${what}: ok")
endfunction()

run("cmake --install" ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix}
    --component client)
foreach(f include/kvnode/kvnode_client.h include/kvnode/client/local_client.hpp
          include/kvnode/common/result.hpp lib/libkvnode_client.a lib/libkvnode_client.so
          lib/libkvnode_client.so.0 lib/pkgconfig/kvnode-client.pc lib/cmake/kvnode/kvnodeConfig.cmake
          lib/cmake/kvnode/kvnodeConfigVersion.cmake lib/cmake/kvnode/kvnodeTargets.cmake)
  if(NOT EXISTS ${prefix}/${f})
    message(FATAL_ERROR "cmake --install did not install ${f}")
  endif()
endforeach()
# libkvnode_client.so exports the C API and nothing else.
execute_process(COMMAND nm -D --defined-only ${prefix}/lib/libkvnode_client.so
                RESULT_VARIABLE rc OUTPUT_VARIABLE symbols ERROR_VARIABLE nm_err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "nm -D libkvnode_client.so failed: ${nm_err}")
endif()
string(REGEX MATCHALL "[^\n]+" symbols "${symbols}")
foreach(line ${symbols})
  if(NOT line MATCHES " (kvnode_[a-z_]+@@KVNODE_CLIENT_0|KVNODE_CLIENT_0)$")
    message(FATAL_ERROR "libkvnode_client.so exports more than kvnode_*: ${line}")
  endif()
endforeach()

# The installed package stands alone: no msgpack (a private, header-only dependency), and the
# CMake files name no path into kvnode's source or build tree; the .pc names the prefix.
get_filename_component(source_dir ${PROJECT_DIR}/../../.. ABSOLUTE)
file(GLOB package_files ${prefix}/lib/cmake/kvnode/*.cmake ${prefix}/lib/pkgconfig/*.pc)
foreach(f ${package_files})
  file(READ ${f} text)
  set(banned msgpack)
  if(f MATCHES "[.]cmake$")
    list(APPEND banned ${source_dir}/ ${BUILD_DIR})
  endif()
  foreach(b ${banned})
    string(FIND "${text}" "${b}" at)
    if(NOT at EQUAL -1)
      message(FATAL_ERROR "${f} names ${b}: the installed package must not need it")
    endif()
  endforeach()
endforeach()
file(STRINGS ${prefix}/lib/pkgconfig/kvnode-client.pc pc_prefix REGEX "^prefix=")
if(NOT pc_prefix STREQUAL "prefix=${prefix}")
  message(FATAL_ERROR "kvnode-client.pc says '${pc_prefix}', not prefix=${prefix}")
endif()

# A separate project through find_package(kvnode).
run("configure install_project" ${CMAKE_COMMAND} -S ${PROJECT_DIR} -B ${WORK_DIR}/build
    -G ${GENERATOR} -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_C_COMPILER=${C_COMPILER}
    -DCMAKE_CXX_COMPILER=${CXX_COMPILER} "-DCMAKE_C_FLAGS=${FLAGS}" "-DCMAKE_CXX_FLAGS=${FLAGS}"
    "-DCMAKE_EXE_LINKER_FLAGS=${FLAGS}")
run("build install_project" ${CMAKE_COMMAND} --build ${WORK_DIR}/build)

# The C example with pkg-config alone.
execute_process(COMMAND ${CMAKE_COMMAND} -E env PKG_CONFIG_PATH=${prefix}/lib/pkgconfig
                        pkg-config --cflags --libs kvnode-client
                RESULT_VARIABLE rc OUTPUT_VARIABLE pc_flags ERROR_VARIABLE pc_err
                OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "pkg-config --cflags --libs kvnode-client failed: ${pc_err}")
endif()
separate_arguments(pc_flags UNIX_COMMAND "${pc_flags}")
separate_arguments(flags UNIX_COMMAND "${FLAGS}")
run("gcc with pkg-config" ${C_COMPILER} -std=c99 -Wall -Wextra -Wpedantic -Werror ${flags}
    ${PROJECT_DIR}/engine_example.c ${pc_flags} -o ${WORK_DIR}/engine_example_pkgconfig)

# Each example against no node: a clean failure that says why. No LD_LIBRARY_PATH: the prefix is
# no system path, so each finds the library by its rpath (CMake's, or the pkg-config file's).
set(no_node ${WORK_DIR}/no-node.sock)
foreach(example build/local_client_example build/engine_example_cpp build/engine_example_c
                engine_example_pkgconfig)
  execute_process(COMMAND ${CMAKE_COMMAND} -E env --unset=LD_LIBRARY_PATH
                          ${WORK_DIR}/${example} ${no_node}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  string(FIND "${out}" "not_found: no kvnode local socket at ${no_node}" said)
  if(NOT rc EQUAL 1 OR said EQUAL -1)
    message(FATAL_ERROR "${example} with no node: exit ${rc} (1 expected), said:\n${out}")
  endif()
  message(STATUS "${example} with no node: exit 1, ${out}")
endforeach()

# Then against a node as the README starts them (32 MiB chunks, a 1 GB pool; no controller
# reachable, which local clients do not need): each example runs as written and succeeds.
if(KVNODE)
  set(sock ${WORK_DIR}/node.sock)
  execute_process(
    COMMAND sh -c "exec \"$0\" --instance-id install-test --controller-pull-url 127.0.0.1:1 \
--controller-reply-url 127.0.0.1:2 --chunk-bytes 33554432 --max-local-cpu-size 1 \
--full-sync-startup-delay 0 --http-port -1 --local-socket \"$1\" --ucx-tls tcp \
--ucx-net-devices lo --log-level warn > \"$2\" 2>&1 & echo $!" ${KVNODE} ${sock}
            ${WORK_DIR}/node.log
    OUTPUT_VARIABLE node_pid OUTPUT_STRIP_TRAILING_WHITESPACE)
  macro(stop_node)
    execute_process(COMMAND kill ${node_pid})
  endmacro()
  foreach(i RANGE 300)
    if(EXISTS ${sock})
      break()
    endif()
    execute_process(COMMAND sleep 0.1)
  endforeach()
  if(NOT EXISTS ${sock})
    file(READ ${WORK_DIR}/node.log log)
    stop_node()
    message(FATAL_ERROR "the node did not start in 30 s:\n${log}")
  endif()
  foreach(example build/local_client_example build/engine_example_cpp build/engine_example_c
                  engine_example_pkgconfig)
    execute_process(COMMAND ${CMAKE_COMMAND} -E env --unset=LD_LIBRARY_PATH
                            ${WORK_DIR}/${example} ${sock}
                    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
    if(NOT rc EQUAL 0)
      stop_node()
      message(FATAL_ERROR "${example} against the README's node: exit ${rc}, said:\n${out}")
    endif()
    message(STATUS "${example} against the README's node: ${out}")
  endforeach()
  stop_node()
endif()
