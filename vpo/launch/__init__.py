"""From a command's parts to a run: the named presets (`presets`) and the one assembly
(`assemble`) that every entry point calls."""
