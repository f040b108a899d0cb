"""`python -m broker.cli ...` runs the pymq CLI."""
from broker.cli import main

main()
