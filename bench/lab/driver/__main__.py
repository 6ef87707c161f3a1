"""``python -m bench.lab.driver``: run the fast driver with the command line's options."""

import sys

from bench.lab.driver.run import main

if __name__ == "__main__":
    sys.exit(main())
