// Why a client cannot reach a node's local socket, said at once instead of after the request
// timeout (a ZMQ ipc connect never fails; the first request just waits): the file is missing or
// not a socket, it is owner-only and we are not its owner, or nothing listens on it any more.
#pragma once

#include <string>

#include "kvnode/common/result.hpp"

namespace kvnode::node {

Status check_local_socket(const std::string& path);

}  // namespace kvnode::node
