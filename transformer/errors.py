"""Every error caused by what a user gave (config, data, paths, text, checkpoints), in one place.

Launch programs print a `UserError` as one line, `error: <message>`, and exit 1 instead of a
traceback: each message names the problem and the fix (for config values, the `--config.` flag).
The subclasses say which kind of input was at fault; each is also a ValueError (or RuntimeError)
so that library callers can catch them the usual way.
"""


class UserError(Exception):
  """Bad input from the user; the message says what and how to fix it."""


class ConfigError(UserError, ValueError):
  """A model, training or decoding setting that cannot work; the message names the field."""


class DataError(UserError, ValueError):
  """Input data that cannot be used, with the file and position at fault."""


class TokenizerError(UserError, ValueError):
  """Text or token ids a tokenizer cannot handle (unknown special tokens, ids outside the vocabulary)."""


class CheckpointError(UserError, ValueError):
  """A checkpoint or workdir that does not fit: missing, or with missing or mis-shaped tensors, named."""


class AssetError(UserError, RuntimeError):
  """A file that could not be fetched or failed its sha256 check."""


class WorkdirError(UserError, RuntimeError):
  """A workdir that cannot be used now: held by another run, unwritable or full."""


class TrainingError(UserError, RuntimeError):
  """Training that cannot go on (a non-finite loss); the message names the step and the fix."""


class InputWarning(UserWarning):
  """Input used, but not all of it as given (a text cut to the model's length); launch programs print
  it as one `warning:` line on stderr."""
