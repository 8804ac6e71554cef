# Every dependency comes from a Debian 12 package, found through find_package or pkg-config.
if(NOT KVNODE_PYTHON_PACKAGE)  # the client library (the Python wheel's) needs msgpack alone
  find_package(Threads REQUIRED)
  find_package(nlohmann_json 3.10 REQUIRED)
endif()

# msgpack-cxx's CMake target drags in Boost; the headers alone need none with MSGPACK_NO_BOOST.
find_path(MSGPACK_INCLUDE_DIR msgpack.hpp REQUIRED)
add_library(kvnode_msgpack INTERFACE)
target_include_directories(kvnode_msgpack SYSTEM INTERFACE ${MSGPACK_INCLUDE_DIR})
target_compile_definitions(kvnode_msgpack INTERFACE MSGPACK_NO_BOOST MSGPACK_DEFAULT_API_VERSION=3)
add_library(kvnode::msgpack ALIAS kvnode_msgpack)

if(KVNODE_FUZZ OR KVNODE_PYTHON_PACKAGE)
  return()
endif()

find_package(CLI11 REQUIRED)
find_package(spdlog REQUIRED)
find_package(cppzmq REQUIRED)
find_package(ucx REQUIRED)
find_package(PkgConfig REQUIRED)
pkg_check_modules(IBVERBS REQUIRED IMPORTED_TARGET libibverbs)
pkg_check_modules(RDMACM REQUIRED IMPORTED_TARGET librdmacm)
find_package(yaml-cpp REQUIRED)
pkg_check_modules(HTTPLIB REQUIRED IMPORTED_TARGET cpp-httplib)
if(KVNODE_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()
if(KVNODE_BUILD_BENCH)
  find_package(benchmark REQUIRED)
endif()

# CUDA is optional: only the runtime is linked (never the driver library; see docs/operations.md).
set(KVNODE_HAVE_CUDA OFF)
if(NOT KVNODE_CUDA STREQUAL "OFF")
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND)
    set(KVNODE_HAVE_CUDA ON)
  elseif(KVNODE_CUDA STREQUAL "ON")
    message(FATAL_ERROR "KVNODE_CUDA=ON but the CUDA Toolkit was not found")
  endif()
endif()
message(STATUS "kvnode: CUDA support ${KVNODE_HAVE_CUDA}")
