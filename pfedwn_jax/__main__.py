import sys

from pfedwn_jax.cli import main

sys.exit(main())
