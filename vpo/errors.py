"""The library's error types: each names what is wrong (field, file, tensor) and how to fix it."""


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the field and how to fix it."""


class CheckpointError(ValueError):
    """A checkpoint folder cannot be read as configured; the message names the file and tensor."""


class CheckpointWriteError(CheckpointError):
    """A checkpoint could not be written (a full disk, a folder without write permission, an I/O
    error); the message names the folder, the free space, and how to continue (`--resume`)."""


class RewardError(ValueError):
    """A reward function failed or returned bad values; the message names the function, the
    dataset row and the value."""


class EnvError(ValueError):
    """An environment failed, hung or returned bad values; the message names the environment,
    the call and the dataset row."""


class RequestError(ValueError):
    """A request to `vpo serve` is invalid; the message names the field and what is allowed.
    `status` is the HTTP status it answers with (400 malformed or over the context, 404 an
    unknown model, 413 too large, 422 a bad value), `param` the field, `code` a short name."""

    def __init__(self, message: str, *, status: int = 422, param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.param, self.code = status, param, code
