"""What every absl launch program shares: user errors become one line on stderr and exit 1."""

import sys

from absl import app

from transformer.errors import UserError


def run(main) -> None:
  def main_with_clean_errors(argv):
    try:
      return main(argv)
    except UserError as e:
      print(f"error: {e}", file=sys.stderr)
      sys.exit(1)

  app.run(main_with_clean_errors)
