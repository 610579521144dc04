"""One rollout: the jitted KV-cache sampler (`sampler`) and the rewards and advantages of its
generations (`rewards`: in-graph or host rewards, scalarisation, dynamic sampling)."""
