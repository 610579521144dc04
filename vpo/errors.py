"""The library's error types: each names what is wrong (field, file, tensor) and how to fix it."""


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the field and how to fix it."""


class CheckpointError(ValueError):
    """A checkpoint folder cannot be read as configured; the message names the file and tensor."""
