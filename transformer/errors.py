"""The one base class of errors caused by what a user gave (config, data, paths, text).

Launch programs print these as one line and exit 1 instead of a traceback: the message already
names the problem and the fix.
"""


class UserError(Exception):
  """Bad input from the user; the message says what and how to fix it."""
