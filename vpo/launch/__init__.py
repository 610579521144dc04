"""From a command's parts to a run: the named presets (`presets`), the one assembly
(`assemble`) that every entry point calls, and the runs that read a trained policy
(`policy_runs`: `vpo eval`, `vpo search`, `vpo sample`)."""
