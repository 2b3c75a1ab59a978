"""`python -m laned_client URL IN OUT`: the command (`laned_client.cli`)."""

from .cli import main

if __name__ == "__main__":
    main()
