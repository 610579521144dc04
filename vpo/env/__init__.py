"""Multi-turn environments: the interface, episodes with the KV cache kept, shipped environments."""
