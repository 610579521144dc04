"""vpo: JAX-native RL post-training (GRPO family, Vector Policy Optimization) and in-graph search.

Submodules are imported on demand (`from vpo import objectives, evaluation`), so importing the
objective alone pulls in nothing but jax and numpy.
"""

__version__ = "0.1.0"
