import sys

from effect_ledger.cli import main

sys.exit(main())
