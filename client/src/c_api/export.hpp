// The C API's header, included with default visibility: libkvnode_client.so is built with
// -fvisibility=hidden (and a version script), so the kvnode_* functions declared there are all it
// exports. Every file of the C API includes the header through this one, first.
#pragma once

#pragma GCC visibility push(default)
#include "kvnode/kvnode_client.h"
#pragma GCC visibility pop
