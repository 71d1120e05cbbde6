"""`python -m jaxscale`: the same process edge as the `jaxscale` console script (`cli.entry`)."""

from jaxscale.cli import entry

if __name__ == "__main__":
    entry()
