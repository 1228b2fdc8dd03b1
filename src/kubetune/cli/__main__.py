"""``python -m kubetune.cli``."""

from .main import main

main()
