import sys

import numpy as np

import kvnode

LAYERS, BLOCKS, BLOCK, HEADS, HEAD_SIZE = 8, 64, 16, 8, 64  # fp16: a 16-token chunk is 256 KiB
with kvnode.connect(sys.argv[1]) as client:  # the node's --local-socket
    kv_caches = [kvnode.host_array((2, BLOCKS, BLOCK, HEADS, HEAD_SIZE), np.float16)
                 for _ in range(LAYERS)]  # vLLM's layout; a GPU engine passes its CUDA tensors
    with client.register_kv_cache(kv_caches, block_size=BLOCK, layout="vllm") as kv:
        tokens = list(range(1000, 1064))  # the prompt's token ids: 4 blocks of 16
        kv_caches[0][:, [7, 3, 12, 9]] = 1.0  # what the engine computed, in its blocks
        stored = kv.store(tokens, block_ids=[7, 3, 12, 9])  # tokens stored
        loaded = kv.load(tokens, block_ids=[40, 41, 42, 43], retrieve=True)  # into other blocks
        assert (kv_caches[0][:, 40:44] == 1.0).all()
        print(f"stored {stored} tokens, loaded {loaded} into blocks 40-43")
