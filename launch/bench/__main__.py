"""`python -m launch.bench`: the benchmarks' tables (launch/bench/__init__.py says which and how)."""

from launch.bench import main
from transformer import cli

if __name__ == "__main__":
  cli.run(main)
