"""Pallas kernels, each beside its plain-JAX reference; imported as `vpo.kernels`."""
