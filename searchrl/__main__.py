"""`python -m searchrl ...` is the same as `searchrl ...`."""

import sys

from searchrl.cli import main

sys.exit(main())
