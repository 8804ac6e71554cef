// The C API's host memory the node can map: HostKvMemory (a sealed memfd, mapped here) behind an
// opaque handle. Each call touches only its own handle, so all are thread-safe.
#include <string>

#include "c_api/c_api.hpp"

using kvnode::c_api::fail;
using kvnode::c_api::guarded;
using kvnode::c_api::invalid;
using kvnode::c_api::ok;

extern "C" kvnode_status_t kvnode_host_memory_create(size_t bytes, const char* name,
                                                     kvnode_host_memory_t** memory,
                                                     kvnode_error_t* err) {
  return guarded(err, [&] {
    if (memory == nullptr) return invalid("kvnode_host_memory_create: memory is NULL", err);
    *memory = nullptr;
    auto created = kvnode::client::HostKvMemory::create(bytes, name ? name : "kvnode-kv");
    if (!created) return fail(created.error(), err);
    *memory = std::make_unique<kvnode_host_memory>(std::move(created).value()).release();
    return ok(err);
  });
}

extern "C" void* kvnode_host_memory_data(const kvnode_host_memory_t* memory) {
  return memory ? memory->memory.data() : nullptr;
}

extern "C" size_t kvnode_host_memory_size(const kvnode_host_memory_t* memory) {
  return memory ? memory->memory.size() : 0;
}

extern "C" int kvnode_host_memory_fd(const kvnode_host_memory_t* memory) {
  return memory ? memory->memory.fd() : -1;
}

extern "C" void kvnode_host_memory_free(kvnode_host_memory_t* memory) {
  (void)guarded(nullptr, [&] {
    std::unique_ptr<kvnode_host_memory> owned(memory);  // unmaps and closes the memfd
    return KVNODE_OK;
  });
}
