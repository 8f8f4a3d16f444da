import sys

from effect_ledger_client.console.serve import main

sys.exit(main())
