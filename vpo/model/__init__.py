"""The policy network and where its parameters live.

    decoder   `Decoder`: the Llama 3 / Qwen2 / Qwen2.5 / Qwen3 decoder with a shared-prefix KV cache
    lora      low-rank adapters on a frozen base (`LoRA`, `add_adapters`, merge and export)
    sharding  the ("data", "fsdp", "tensor") mesh, the logical-axis rules, multi-host start-up
"""
