"""kvnode: drive the kvnode daemon on this host from Python (vLLM, SGLang, LMCache engines).

Python over libkvnode_client.so (the C API, ``kvnode_client.h``) through ctypes; the installed
package ships the library (``pip install ./python`` compiles it). An engine connects to its
node's local socket, registers its paged KV cache once, then stores and loads by block table;
the node copies between the engine's blocks and its pool in place (host memory through a shared
memfd, GPU memory through CUDA IPC)::

    import kvnode

    with kvnode.connect("/tmp/kvnode-vllm-0.sock") as client:
        kv = client.register_kv_cache(layers, block_size=16)      # vLLM layout, one per layer
        stored = kv.store(tokens, block_ids)                       # tokens stored
        loaded = kv.load(tokens, other_block_ids, retrieve=True)   # tokens loaded

Errors from the node raise :class:`kvnode.Error` (``.status``: "frozen", "not_found", ...);
bad arguments raise TypeError or ValueError naming the argument. ``import kvnode`` works without
the library; the first call that needs it says where it looked (``$KVNODE_CLIENT_LIB`` first).
"""

from __future__ import annotations

from ._client import Client, KVCache, connect
from ._errors import Error
from ._hashes import chunk_hashes
from ._host import host_array

__all__ = ["Client", "Error", "KVCache", "LAYOUTS", "__version__", "chunk_hashes", "connect",
           "host_array"]
__version__ = "0.1.0"

# register_kv_cache's layout names
LAYOUTS = ("vllm", "flashinfer", "mla", "sglang", "packed", "packed_cpu", "packed_mla", "strided")
