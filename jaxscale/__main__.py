"""`python -m jaxscale`: the same process edge as the `jaxscale` console script (`cli.main`)."""

import sys

from jaxscale.cli import main

if __name__ == "__main__":
    sys.exit(main())
