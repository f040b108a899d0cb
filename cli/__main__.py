"""`python -m cli ...` runs the pymq CLI."""
from cli import main

main()
