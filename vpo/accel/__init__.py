"""Ahead-of-time builds of vpo's programs for an accelerator this host does not have.

    targets         a named target (v5e, v5p, v6e, h100; one chip or several) → its devices
                    and mesh
    build           the programs (RL step, sampler, SFT step, in-graph search, kernels) from
                    abstract inputs (shapes and shardings only, never weights), compiled for a
                    target
    program_report  per program: compiles or the compiler's error, bytes per device against
                    the chip's memory, collectives, compile time, and the setting to change

Needs libtpu / the CUDA plugin of jax's own version (`pip install 'vpo[aot]'`);
`targets.missing_wheels` says what is absent.
"""
