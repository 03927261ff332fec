"""`python -m autoopt.cli` == the `autoopt` console script (useful where the package is not installed)."""
from autoopt.cli import main

main()
